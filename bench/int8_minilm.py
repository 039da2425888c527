"""An int8 copy of MiniLM, measured by bench/guardrails.py beside the shipped embedder.

Not shipped: on an AVX2 core it was about 1.2 times faster than float32 (docs/benchmarks.md,
"An int8 copy of MiniLM for CPUs without bf16"). The latency table keeps a row for it so
that a reading on a CPU with AVX-512 VNNI, where fbgemm's int8 kernel is faster, shows
whether it would bring the checks within issue 18's goal there.

Without bf16, a float32 pass over a request's first 300 characters is most of what its
input checks cost, and its projections are about 85% of the pass. The copy runs them
through fbgemm's int8 matmul with one activation scale per token
(`engine.linear.W8A8Linear`). Plain dynamic quantisation, one scale for the whole input, put
its vectors at cosine 0.975 to float32; per-token scales and SmoothQuant-style smoothing,
with each layer's feed-forward output projection (whose inputs, after GELU, have the widest
range) kept in float32, keep them within 0.998, as close as the bfloat16 copy that CPUs
with native bf16 use.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from engine.linear import fbgemm_supported, make_linear
from engine.smoothing import ALPHA, CALIBRATION_TEXT, smoothing_scale
from retrieval.embedder import Embedder


class SmoothedInt8Linear(torch.nn.Module):
    """A `torch.nn.Linear` through int8 weights and per-token int8 activations.

    Input channel j is divided by `s_j` and the weights' column j multiplied by it, which
    leaves the product unchanged and moves part of the few wide channels' range into the
    weights, quantized per output channel (`engine.smoothing.smoothing_scale`, the engine's
    alpha: 0.5 put MiniLM's vectors at cosine 0.9991 on average to float32, no smoothing at
    0.9960), with `max|x_j|` from a calibration pass.
    """

    def __init__(self, linear: torch.nn.Linear, input_maxima: torch.Tensor) -> None:
        super().__init__()
        weight = linear.weight.detach().float()
        scales = smoothing_scale(input_maxima, weight, ALPHA)
        self.inverse_scales: torch.Tensor
        self.register_buffer("inverse_scales", 1.0 / scales)
        bias = None if linear.bias is None else linear.bias.detach().float()
        self.projection = make_linear(weight * scales, bias, torch.float32, "w8a8")
        self.out_features = linear.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1]).float() * self.inverse_scales
        return self.projection(rows).reshape(*x.shape[:-1], self.out_features)


def _quantized_projections(layer: Any) -> Iterator[tuple[Any, str]]:
    """(owner, attribute) of each projection of a BERT layer that the copy runs in int8:
    all but the feed-forward output (`layer.output.dense`)."""
    attention = layer.attention
    for name in ("query", "key", "value"):
        yield attention.self, name
    yield attention.output, "dense"
    yield layer.intermediate, "dense"


def _encoder_layers(model: Any) -> list[Any] | None:
    """The BERT layers of a sentence-transformers model, or None for another layout."""
    auto_model = getattr(model[0], "auto_model", None)
    config = getattr(auto_model, "config", None)
    if getattr(config, "model_type", None) != "bert":
        return None
    return list(auto_model.encoder.layer)


@torch.inference_mode()
def _input_maxima(
    layers: list[Any], forward: Callable[[str], object], texts: Sequence[str]
) -> dict[int, torch.Tensor]:
    """max|x| per input channel of each projection to quantize, over a float pass of
    `texts` one at a time (so no padding token counts); keyed by the Linear's id."""
    maxima: dict[int, torch.Tensor] = {}

    def record(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> None:
        x = inputs[0].detach().reshape(-1, inputs[0].shape[-1]).abs().amax(dim=0).float()
        key = id(module)
        maxima[key] = torch.maximum(maxima[key], x) if key in maxima else x

    handles = [
        getattr(owner, name).register_forward_pre_hook(record)
        for layer in layers
        for owner, name in _quantized_projections(layer)
    ]
    try:
        for text in texts:
            forward(text)
    finally:
        for handle in handles:
            handle.remove()
    return maxima


def calibration_texts() -> list[str]:
    """The paragraphs of the engine's calibration text (prose, lists, code and numbers),
    each a few hundred characters, as long as the heads the guardrails embed."""
    return [p.strip() for p in CALIBRATION_TEXT.read_text("utf-8").split("\n\n") if p.strip()]


def int8_copy(model: Any, forward: Callable[[str], object]) -> Any | None:
    """A copy of sentence-transformers `model` whose projections run in int8 (all but each
    layer's feed-forward output), calibrated by `forward(text)`, a float pass of `model`,
    over `calibration_texts`; None where fbgemm is missing or the model is not a BERT
    encoder.

    The copy shares every float tensor it keeps with `model` (embeddings, norms, the float
    projections), so it adds only the int8 weights, about a quarter of the ones it replaces.
    """
    layers = _encoder_layers(model)
    if layers is None or not fbgemm_supported():
        return None
    maxima = _input_maxima(layers, forward, calibration_texts())
    shared = {id(t): t for t in itertools.chain(model.parameters(), model.buffers())}
    quantized = copy.deepcopy(model, shared)
    copied_layers = _encoder_layers(quantized)
    assert copied_layers is not None
    for layer, copied in zip(layers, copied_layers, strict=True):
        pairs = zip(_quantized_projections(layer), _quantized_projections(copied), strict=True)
        for (owner, name), (copied_owner, _) in pairs:
            linear = getattr(owner, name)
            setattr(copied_owner, name, SmoothedInt8Linear(linear, maxima[id(linear)]))
    return quantized


def int8_embedder(float32: Embedder, threads: int | None) -> Embedder | None:
    """An embedder on an int8 copy of `float32`'s model (`int8_copy`), on `threads` torch
    threads a call; None where `int8_copy` gives none."""
    quantized = int8_copy(float32._model, lambda text: float32.embed([text]))
    return None if quantized is None else Embedder(quantized, threads=threads)
