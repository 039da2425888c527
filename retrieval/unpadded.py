"""Sentence vectors of a few texts from one unpadded pass of a BERT model.

A padded batch computes every text at the longest one's length: a guardrail request's
batch (its head, about 70 word pieces, and one or two short suspect sentences) is mostly
padding. Here the texts' tokens share one row, each attending only to its own tokens
(a block-diagonal mask) with positions restarting per text, which gives each text the
vector it gets alone, without computing the padding (21 against 16 ms for such a batch,
bf16, one thread).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from sentence_transformers import SentenceTransformer

# Largest row: the mask is tokens x tokens, and past a few hundred tokens padding costs
# less than attention over the whole row.
MAX_TOKENS = 512


def supports_unpadded(model: SentenceTransformer) -> bool:
    """True for a BERT encoder (absolute positions) with mean pooling, then at most a
    normalisation: the layout whose vectors `unpadded_pass` reproduces."""
    modules = list(model)
    if len(modules) < 2 or any(type(m).__name__ != "Normalize" for m in modules[2:]):
        return False
    transformer, pooling = modules[0], modules[1]
    config = getattr(getattr(transformer, "auto_model", None), "config", None)
    if getattr(config, "model_type", None) != "bert":
        return False
    if getattr(config, "position_embedding_type", "absolute") != "absolute":
        return False
    get_config = getattr(pooling, "get_config_dict", None)
    if type(pooling).__name__ != "Pooling" or get_config is None:
        return False
    pooling_config = get_config()
    if "pooling_mode" in pooling_config:  # sentence-transformers 5
        return bool(pooling_config["pooling_mode"] == "mean")
    others = [k for k, v in pooling_config.items() if k.startswith("pooling_mode_") and v]
    return others == ["pooling_mode_mean_tokens"]


def unpadded_pass(
    model: SentenceTransformer, features: dict[str, torch.Tensor]
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Mean-pooled (not normalised) vectors of a tokenised, padded batch, and each text's
    token states ([CLS] and [SEP] included, as a padded pass gives them cut to the text's
    length), computed in one row of at most MAX_TOKENS tokens; call under
    `torch.inference_mode()`."""
    import torch  # here, like the embedder's: importing `retrieval` does not load torch

    lengths = features["attention_mask"].sum(dim=1)
    total = int(lengths.sum())
    if total > MAX_TOKENS:
        raise ValueError(f"{total} tokens do not fit one row of {MAX_TOKENS}")
    sizes = [int(n) for n in lengths.tolist()]
    input_ids = torch.cat([features["input_ids"][i, :n] for i, n in enumerate(sizes)])
    positions = torch.cat([torch.arange(n) for n in sizes])
    owner = torch.repeat_interleave(torch.arange(len(sizes)), lengths)
    mask = (owner[:, None] == owner[None, :]).to(torch.long)
    transformer: Any = model[0]
    output = transformer.auto_model(
        input_ids=input_ids[None],
        attention_mask=mask[None],
        position_ids=positions[None],
        token_type_ids=torch.zeros_like(input_ids)[None],
    )
    tokens = output.last_hidden_state[0].float()
    sums = torch.zeros(len(sizes), tokens.shape[1]).index_add_(0, owner, tokens)
    return sums / lengths[:, None].to(sums.dtype), list(torch.split(tokens, sizes))
