"""SmoothQuant-style smoothing for w8a8 weights (Xiao et al. 2022).

A few input channels of a projection carry most of the activations' range, so quantizing
each token to int8 crushes the rest. Dividing input channel j by `s_j` and multiplying the
weights' column j by `s_j` leaves the product unchanged and moves part of that range into
the weights, which are quantized per output channel. Both projections smoothed here read
an RMSNorm's output, so the 1/s folds into the norm's weight and costs nothing per step.

`s_j = max|x_j|^alpha / max|w_j|^(1 - alpha)`, with activation maxima from one float pass
over `calibration.txt` at load time.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from engine.types import EngineError

CALIBRATION_TEXT = Path(__file__).with_name("calibration.txt")
# Share of the activations' range moved into the weights: the paper's default. On SmolLM2 it
# kept the greedy answers with each of three calibration texts; 0.6 lost one of them.
ALPHA = 0.5


class CalibrationMissing(EngineError):
    """w8a8 weights were asked for without the token ids their smoothing calibrates on."""


@dataclass(frozen=True, slots=True)
class LayerScales:
    """Per-input-channel smoothing scales of one decoder layer, `[hidden_size]` each."""

    qkv: torch.Tensor  # divides `input_layernorm`, multiplies q/k/v's columns
    gate_up: torch.Tensor  # divides `post_attention_layernorm`, multiplies gate/up's columns


def calibration_ids(tokenizer: Any) -> list[int]:
    """The shipped calibration text as `tokenizer`'s ids."""
    return list(tokenizer(CALIBRATION_TEXT.read_text()).input_ids)


@torch.inference_mode()
def activation_maxima(hf_model: Any, ids: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """max|x| per channel of each layer's q_proj and gate_proj inputs over `ids`, float32."""
    maxima: dict[tuple[int, str], torch.Tensor] = {}

    def record(key: tuple[int, str]) -> Any:
        def hook(_module: Any, inputs: tuple[torch.Tensor, ...]) -> None:
            x = inputs[0].detach().flatten(0, -2).abs().amax(dim=0).float().cpu()
            maxima[key] = torch.maximum(maxima[key], x) if key in maxima else x

        return hook

    layers = hf_model.model.layers
    handles = []
    for i, layer in enumerate(layers):
        handles.append(layer.self_attn.q_proj.register_forward_pre_hook(record((i, "qkv"))))
        handles.append(layer.mlp.gate_proj.register_forward_pre_hook(record((i, "gate_up"))))
    try:
        device = next(hf_model.parameters()).device
        hf_model(torch.tensor([ids], device=device))
    finally:
        for handle in handles:
            handle.remove()
    return [(maxima[i, "qkv"], maxima[i, "gate_up"]) for i in range(len(layers))]


def smoothing_scale(x_max: torch.Tensor, weight: torch.Tensor, alpha: float) -> torch.Tensor:
    """`s_j` for a projection's input channels; `weight` is `[out, in]`."""
    w_max = weight.detach().abs().amax(dim=0).float().cpu().clamp(min=1e-5)
    return (x_max.clamp(min=1e-5).pow(alpha) / w_max.pow(1 - alpha)).clamp(min=1e-5)


def layer_scales(hf_model: Any, ids: list[int], alpha: float = ALPHA) -> list[LayerScales]:
    """The smoothing scales of every decoder layer, calibrated on `ids` in the float model."""
    if not ids:
        raise CalibrationMissing("w8a8 weights need calibration token ids (calibration_ids)")
    scales = []
    for layer, (qkv_max, gate_up_max) in zip(
        hf_model.model.layers, activation_maxima(hf_model, ids), strict=True
    ):
        attn, mlp = layer.self_attn, layer.mlp
        qkv = torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight])
        gate_up = torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight])
        scales.append(
            LayerScales(
                smoothing_scale(qkv_max, qkv, alpha), smoothing_scale(gate_up_max, gate_up, alpha)
            )
        )
    return scales
