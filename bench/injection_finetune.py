"""Would fine-tuning MiniLM's last layers beat the injection classifier's token head?

Run: `PYTHONHASHSEED=0 .venv/bin/python bench/injection_finetune.py [--from-layer 4]
[--learning-rate 3e-5] [--epochs 3]` (about 12 minutes on two CPU cores for the last two
layers).

Issue 18 asks for a stronger model than the linear one on frozen MiniLM vectors if that
cannot reach its goal, for example MiniLM's last layers fine-tuned. This compares, on
fold 0 of the training split's 5-fold cross-validation (`guardrails/train_injection.py`;
the held-out split is never read), two heads stacked on the same linear model's
out-of-fold logits:
- baseline: the shipped recipe (`_fit`: the token head over frozen last-layer vectors);
- tuned: a copy of MiniLM's layers from `--from-layer` on, fine-tuned (AdamW, cosine
  decay) on the frozen layers' cached states, under the token head's pooling.
Both read float32 MiniLM, whatever the CPU. It prints each one's recall on the fold's
attacks where its false-positive rate on the fold's harmless texts is 0.5%, 1% and 2%, and
by source at 1%.
"""

from __future__ import annotations

import argparse
import copy
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
import torch.nn.functional as f
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import StratifiedKFold

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from guardrails import train_injection as training  # noqa: E402
from guardrails.embedding import embedding_head  # noqa: E402
from guardrails.injection_classifier import sigmoid, text_windows  # noqa: E402
from guardrails.normalize import normalize  # noqa: E402
from retrieval.embedder import Embedder  # noqa: E402

FPR_POINTS = (0.005, 0.01, 0.02)
BATCH = 32
HEAD_LEARNING_RATE = 3e-3


def hidden_states(
    embedder: Embedder, heads: list[str], layer: int
) -> tuple[dict[str, npt.NDArray[np.float16]], training.EmbeddingCache, Any]:
    """Each head's float32 MiniLM states after `layer` layers ([CLS] and [SEP] kept), its
    sentence and token vectors as the embedder makes them from the same pass (for the
    baseline's features), and the model."""
    model = embedder._model
    encoder = model[0].auto_model
    states: dict[str, npt.NDArray[np.float16]] = {}
    vectors: training.EmbeddingCache = {}
    unique = sorted(set(heads), key=len, reverse=True)
    for start in range(0, len(unique), 64):
        batch = unique[start : start + 64]
        tokens = model.tokenize(batch)
        with torch.inference_mode():
            out = encoder(
                input_ids=tokens["input_ids"],
                attention_mask=tokens["attention_mask"],
                token_type_ids=tokens["token_type_ids"],
                output_hidden_states=True,
            )
        for row, (head, length) in enumerate(
            zip(batch, tokens["attention_mask"].sum(1), strict=True)
        ):
            states[head] = out.hidden_states[layer][row, : int(length)].numpy().astype(np.float16)
            last = out.hidden_states[-1][row, : int(length)].numpy()
            words = last[1:-1] if len(last) > 2 else last
            vectors[head] = (
                _unit(last.mean(0)),
                words / np.maximum(np.linalg.norm(words, axis=1, keepdims=True), 1e-12),
            )
    return states, vectors, encoder


def _unit(vector: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    return np.asarray(vector / max(float(np.linalg.norm(vector)), 1e-12), dtype=np.float32)


class TunedHead(torch.nn.Module):
    """MiniLM's layers from `layer` on, trainable, then the token head's pooling
    (attention and maximum over projected, L2-normalised token vectors, [CLS] and [SEP]
    left out), stacked on the linear model's logit."""

    def __init__(self, encoder: Any, layer: int) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(copy.deepcopy(encoder.encoder.layer[layer:]))
        self.scale = torch.nn.Parameter(torch.ones(()))
        self.proj = torch.nn.Linear(encoder.config.hidden_size, 128)
        self.att = torch.nn.Linear(128, 1, bias=False)
        self.out = torch.nn.Linear(256, 1)
        torch.nn.init.zeros_(self.out.weight)

    def forward(self, linear: torch.Tensor, states: torch.Tensor, mask: torch.Tensor) -> Any:
        blocked = (1.0 - mask[:, None, None, :].float()) * torch.finfo(torch.float32).min
        h = states
        for layer in self.layers:
            h = layer(h, attention_mask=blocked)
            h = h[0] if isinstance(h, tuple) else h
        words = mask.clone()
        words[:, 0] = False
        words[torch.arange(len(words)), mask.sum(1) - 1] = False
        h = h / h.norm(dim=-1, keepdim=True).clamp(min=1e-12)
        g = f.gelu(self.proj(h), approximate="tanh")
        scores = self.att(g).squeeze(-1).masked_fill(~words, -1e9)
        attended = (torch.softmax(scores, 1)[..., None] * g).sum(1)
        strongest = g.masked_fill(~words[..., None], -1e9).max(1).values
        return self.scale * linear + self.out(torch.cat([attended, strongest], 1)).squeeze(1)

    def head_parameters(self) -> list[torch.nn.Parameter]:
        return [self.scale, *self.proj.parameters(), *self.att.parameters(), *self.out.parameters()]


def padded(states: list[npt.NDArray[np.float16]]) -> tuple[torch.Tensor, torch.Tensor]:
    longest = max(len(s) for s in states)
    batch = np.zeros((len(states), longest, states[0].shape[1]), np.float32)
    mask = np.zeros((len(states), longest), bool)
    for i, s in enumerate(states):
        batch[i, : len(s)] = s
        mask[i, : len(s)] = True
    return torch.from_numpy(batch), torch.from_numpy(mask)


def recall_at_fpr(
    scores: npt.NDArray[np.float64], labels: npt.NDArray[np.int_], fpr: float
) -> tuple[float, float]:
    """(threshold, recall) where `fpr` of the harmless texts score at or above it."""
    negatives = np.sort(scores[labels == 0])[::-1]
    threshold = float(negatives[int(fpr * len(negatives))]) + 1e-9
    return threshold, float(np.mean(scores[labels == 1] >= threshold))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--from-layer", type=int, default=4)
    parser.add_argument("--learning-rate", type=float, default=3e-5)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    started = time.perf_counter()
    torch.manual_seed(0)
    examples = training.with_benign_units(training.load_splits()["train"], training.BENIGN_UNITS)
    heads = [embedding_head(text_windows(normalize(ex.text))[0]) for ex in examples]
    embedder = Embedder.load()  # float32; `vectors` holds every head, so it embeds nothing more
    states, vectors, encoder = hidden_states(embedder, heads, args.from_layer)
    x = training.features(embedder, [ex.text for ex in examples], vectors)
    y = np.array([ex.label for ex in examples])
    weights = training.sample_weights(examples)
    folds = StratifiedKFold(5, shuffle=True, random_state=0).split(x.sentences, y)
    fit_rows, held_rows = next(iter(folds))
    baseline = training._fit(x.rows(fit_rows), y[fit_rows], weights[fit_rows])
    baseline_logits = baseline.predict(x.rows(held_rows))[1]
    scores = {"token head (shipped recipe)": sigmoid(baseline_logits)}
    # The linear model's logits: out of fold on the fit rows (as `_fit` gives its head),
    # the fitted model's on the held rows.
    fit_x, held_x = x.rows(fit_rows), x.rows(held_rows)
    design = training._design(fit_x.sentences, baseline.grams(fit_x.windows))
    held_linear = baseline.linear.decision_function(
        training._design(held_x.sentences, baseline.grams(held_x.windows))
    )
    fit_y, fit_weights = y[fit_rows], weights[fit_rows]
    fit_linear = np.zeros(len(fit_rows))
    inner = StratifiedKFold(5, shuffle=True, random_state=1).split(design, fit_y)
    for a, b in inner:
        model = LogisticRegression(C=training.FULL_C, max_iter=5000)
        model.fit(design[a], fit_y[a], sample_weight=fit_weights[a])
        fit_linear[b] = model.decision_function(design[b])
    tuned = TunedHead(encoder, args.from_layer)
    optimiser = torch.optim.AdamW(
        [
            {"params": list(tuned.layers.parameters()), "lr": args.learning_rate},
            {"params": tuned.head_parameters(), "lr": HEAD_LEARNING_RATE, "weight_decay": 0.0},
        ]
    )
    rates = [group["lr"] for group in optimiser.param_groups]
    by_length = sorted(range(len(fit_rows)), key=lambda i: len(states[heads[fit_rows[i]]]))
    batches = [by_length[i : i + BATCH] for i in range(0, len(by_length), BATCH)]
    rng = np.random.default_rng(0)
    steps = args.epochs * len(batches)
    tuned.train()
    for step in range(steps):
        if step % len(batches) == 0:
            rng.shuffle(batches)
            print(f"epoch {step // len(batches) + 1}/{args.epochs}", flush=True)
        rows = batches[step % len(batches)]
        for group, rate in zip(optimiser.param_groups, rates, strict=True):
            group["lr"] = rate * 0.5 * (1 + math.cos(math.pi * step / steps))
        batch, mask = padded([states[heads[fit_rows[i]]] for i in rows])
        logits = tuned(torch.from_numpy(fit_linear[rows].astype(np.float32)), batch, mask)
        target = torch.from_numpy(fit_y[rows].astype(np.float32))
        loss = f.binary_cross_entropy_with_logits(logits, target, reduction="none")
        loss = (loss * torch.from_numpy(fit_weights[rows].astype(np.float32))).mean()
        optimiser.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        optimiser.step()
    tuned.eval()
    held = np.zeros(len(held_rows))
    with torch.inference_mode():
        for start in range(0, len(held_rows), 64):
            rows = held_rows[start : start + 64]
            batch, mask = padded([states[heads[i]] for i in rows])
            linear = torch.from_numpy(held_linear[start : start + 64].astype(np.float32))
            held[start : start + 64] = torch.sigmoid(tuned(linear, batch, mask)).numpy()
    layers = encoder.config.num_hidden_layers - args.from_layer
    scores[f"last {layers} layers tuned (lr {args.learning_rate:g}, {args.epochs} epochs)"] = held
    held_y = y[held_rows]
    sources = sorted({examples[i].source for i in held_rows if examples[i].label == 1})
    print(f"\nfold 0: {int(held_y.sum())} attacks, {int((held_y == 0).sum())} harmless texts")
    print(
        "| head | "
        + " | ".join(f"recall at FPR {p:.1%}" for p in FPR_POINTS)
        + " | "
        + " / ".join(sources)
        + " at 1% |"
    )
    print("| --- |" + " ---: |" * (len(FPR_POINTS) + 1))
    for name, probabilities in scores.items():
        cells = [f"{recall_at_fpr(probabilities, held_y, p)[1]:.3f}" for p in FPR_POINTS]
        threshold = recall_at_fpr(probabilities, held_y, 0.01)[0]
        by_source = [
            np.mean(
                [
                    probabilities[j] >= threshold
                    for j, i in enumerate(held_rows)
                    if examples[i].source == source and examples[i].label == 1
                ]
            )
            for source in sources
        ]
        print(
            f"| {name} | "
            + " | ".join(cells)
            + " | "
            + " / ".join(f"{r:.2f}" for r in by_source)
            + " |"
        )
    print(f"\nWhole run: {time.perf_counter() - started:.0f} s.")


if __name__ == "__main__":
    main()
