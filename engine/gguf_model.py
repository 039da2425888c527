"""A Llama-family GGUF as the transformers model and tokenizer `PagedLlama` is built from,
without transformers' GGUF loader.

transformers' loader spends about 20 s of a cold start on SmolLM2: it parses the file
four times with gguf-py (engine/gguf_file.py says why that is slow) and rebuilds gguf-py's
tensor-name table once per module. This reads the file once, maps the names with a fixed
table, and otherwise does what transformers does, step for step: the same metadata to
config and tokenizer mapping (`GGUF_TO_TRANSFORMERS_MAPPING`), the same dequantization,
the same un-permutation of Llama's Q and K rows, the same tokenizer converter. The model
is built without initialising weights it then replaces. tests/engine/test_gguf_model.py
checks every tensor, the config and the tokenizer against transformers' own loader.
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import torch

from engine.gguf_file import GGUFFile, MetadataValue

# GGUF architectures read here (Mistral GGUFs say "llama"); others go through transformers.
DIRECT_ARCHITECTURES = frozenset({"llama", "qwen2"})
# GGUF's name for a byte-level BPE tokenizer (`tokenizer.ggml.model`).
BYTE_LEVEL_BPE = "gpt2"
# transformers un-permutes Q and K rows for these (its LlamaTensorProcessor).
_PERMUTED_QK = frozenset({"llama"})

_GLOBAL_TENSORS = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_LAYER_TENSORS = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
# Tensors transformers has no parameter for (Llama 3's precomputed RoPE frequencies: the
# config's rope scaling gives the same).
_SKIPPED_TENSORS = frozenset({"rope_freqs.weight"})
_LAYER_NAME = re.compile(r"^blk\.(\d+)\.(\w+)\.(weight|bias)$")


class UnsupportedGGUF(ValueError):
    """The GGUF holds something this loader does not read; transformers' loader may."""


@dataclass(frozen=True, slots=True)
class TransformersFields:
    """The GGUF metadata as transformers' `load_gguf_checkpoint` sorts it."""

    architecture: str  # the GGUF's
    model_type: str  # transformers'
    config: dict[str, Any] = field(default_factory=dict)
    tokenizer: dict[str, Any] = field(default_factory=dict)
    tokenizer_config: dict[str, Any] = field(default_factory=dict)


def is_direct(gguf: GGUFFile) -> bool:
    """Whether this loader reads `gguf` (else transformers' loader does)."""
    return gguf.metadata.get("general.architecture") in DIRECT_ARCHITECTURES


def transformers_fields(gguf: GGUFFile) -> TransformersFields:
    """Config, tokenizer and tokenizer-config values, as transformers derives them."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_TO_TRANSFORMERS_MAPPING

    architecture = str(gguf.metadata["general.architecture"])
    # transformers compares the name list with "mistral" (whole names only): kept as it is.
    model_type = "mistral" if gguf.metadata.get("general.name") == "mistral" else architecture
    mapping = cast(dict[str, dict[str, dict[str, Any]]], GGUF_TO_TRANSFORMERS_MAPPING)
    parsed: dict[str, dict[str, Any]] = {k: {} for k in mapping}
    parsed["config"]["tie_word_embeddings"] = "output.weight" not in gguf.tensors
    for key, raw in gguf.metadata.items():
        key = key.replace(architecture, model_type)
        prefix, _, config_key = key.partition(".")
        value = _as_transformers_value(raw)
        if isinstance(value, str) and architecture in value:
            value = value.replace(architecture, model_type)
        for parameter, renames in mapping.items():
            renamed = renames.get(prefix, {}).get(config_key, -1)
            if renamed not in (-1, None):
                parsed[parameter][renamed] = value
    if "vocab_size" not in parsed["config"] and "tokens" in parsed["tokenizer"]:
        parsed["config"]["vocab_size"] = len(parsed["tokenizer"]["tokens"])
    return TransformersFields(
        architecture, model_type, parsed["config"], parsed["tokenizer"], parsed["tokenizer_config"]
    )


def _as_transformers_value(value: MetadataValue) -> MetadataValue:
    """transformers reads a one-element array as its element."""
    if isinstance(value, list) and len(value) == 1:
        return value[0]
    return value


def load_config(fields: TransformersFields) -> Any:
    """The transformers config class of the model type, from the GGUF's values."""
    from transformers import AutoConfig

    return AutoConfig.for_model(**fields.config)


def load_tokenizer(fields: TransformersFields, config: Any, path: Path) -> Any:
    """The fast tokenizer transformers builds from a GGUF, built from the fields read once.

    Byte-level BPE vocabularies (GGUF's "gpt2" tokenizer model: SmolLM2, Qwen2, Llama 3)
    are converted here; `legacy=True` is the value transformers takes when none is given,
    without its notice. Others (SentencePiece's) pass converter options that transformers
    applies in a particular order, so transformers' own loader builds them.
    """
    from transformers import AutoTokenizer
    from transformers.integrations.ggml import convert_gguf_tokenizer
    from transformers.models.auto.tokenization_auto import TOKENIZER_MAPPING

    if fields.tokenizer.get("tokenizer_type") != BYTE_LEVEL_BPE:
        return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)  # type: ignore[no-untyped-call]

    backend, extra = convert_gguf_tokenizer(fields.model_type, dict(fields.tokenizer))
    tokenizer_class: Any = TOKENIZER_MAPPING[type(config)][1]
    kwargs: dict[str, Any] = {**fields.tokenizer_config, **extra}
    if "legacy" in inspect.signature(tokenizer_class).parameters:
        kwargs.setdefault("legacy", True)
    return tokenizer_class(
        tokenizer_object=backend, vocab_file=str(path), name_or_path=str(path.parent), **kwargs
    )


def hf_name(gguf_name: str) -> str | None:
    """transformers' parameter name of a GGUF tensor (None: one transformers skips)."""
    if gguf_name in _SKIPPED_TENSORS:
        return None
    stem, _, suffix = gguf_name.rpartition(".")
    if stem in _GLOBAL_TENSORS:
        return f"{_GLOBAL_TENSORS[stem]}.{suffix}"
    match = _LAYER_NAME.match(gguf_name)
    if match is None or match.group(2) not in _LAYER_TENSORS:
        raise UnsupportedGGUF(f"tensor {gguf_name!r} has no place in a Llama-family model")
    index, part, suffix = match.groups()
    return f"model.layers.{index}.{_LAYER_TENSORS[part]}.{suffix}"


def _unpermute(values: torch.Tensor, heads: int) -> torch.Tensor:
    """llama.cpp's converter interleaves each head's rotary halves; undo it (as transformers
    does in `LlamaTensorProcessor._reverse_permute_weights`)."""
    dim = values.shape[0] // heads // 2
    rows = values.reshape(heads, dim, 2, *values.shape[1:])
    return rows.transpose(2, 1).reshape(values.shape).contiguous()


def state_dict(gguf: GGUFFile, fields: TransformersFields, dtype: torch.dtype) -> dict[str, Any]:
    """Every tensor under transformers' name, dequantized as transformers does, in `dtype`."""
    heads = fields.config.get("num_attention_heads")
    kv_heads = fields.config.get("num_key_value_heads")
    tensors: dict[str, torch.Tensor] = {}
    for name, tensor in gguf.tensors.items():
        target = hf_name(name)
        if target is None:
            continue
        values = tensor.to_tensor()
        if fields.architecture in _PERMUTED_QK and heads is not None and kv_heads is not None:
            if ".attn_q." in name:
                values = _unpermute(values, heads)
            elif ".attn_k." in name:
                values = _unpermute(values, kv_heads)
        tensors[target] = values.to(dtype)
    return tensors


def load_gguf_config(gguf: GGUFFile) -> tuple[Any, Any]:
    """The transformers config and tokenizer of a Llama-family GGUF, without its weights."""
    _, config, tokenizer = _fields_config_tokenizer(gguf)
    return config, tokenizer


def _fields_config_tokenizer(gguf: GGUFFile) -> tuple[TransformersFields, Any, Any]:
    if not is_direct(gguf):
        raise UnsupportedGGUF(f"GGUF architecture {gguf.metadata.get('general.architecture')!r}")
    fields = transformers_fields(gguf)
    config = load_config(fields)
    return fields, config, load_tokenizer(fields, config, gguf.path)


def load_gguf_model(gguf: GGUFFile, dtype: torch.dtype) -> tuple[Any, Any]:
    """The transformers model (eval mode, CPU, `dtype`) and tokenizer of a Llama-family GGUF."""
    from transformers import AutoModelForCausalLM, GenerationConfig
    from transformers.modeling_utils import no_init_weights

    fields, config, tokenizer = _fields_config_tokenizer(gguf)
    with no_init_weights():
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)  # type: ignore[no-untyped-call]
    weights = state_dict(gguf, fields, dtype)
    missing, unexpected = model.load_state_dict(weights, strict=False, assign=True)
    tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
    if set(missing) - tied or unexpected:
        raise UnsupportedGGUF(f"tensors missing {missing} or unexpected {unexpected}")
    model.tie_weights()
    model.generation_config = GenerationConfig.from_model_config(config)
    return model.eval(), tokenizer
