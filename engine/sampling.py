"""Turning next-token logits into a token id: penalties and logit bias, then greedy,
temperature, top-k and top-p (the runner has masked the grammars' forbidden tokens)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from engine.types import SamplingParams, TokenLogprob


def apply_penalties(
    logits: torch.Tensor, output_ids: Sequence[int], params: SamplingParams
) -> None:
    """OpenAI's presence and frequency penalties over the tokens generated so far, in place."""
    if not output_ids or not params.has_penalties:
        return
    counts = torch.bincount(
        torch.tensor(output_ids, device=logits.device), minlength=logits.shape[-1]
    )[: logits.shape[-1]].to(logits.dtype)
    logits -= counts * params.frequency_penalty + (counts > 0).to(logits.dtype) * (
        params.presence_penalty
    )


def apply_logit_bias(logits: torch.Tensor, params: SamplingParams) -> None:
    """OpenAI's `logit_bias`: a value added to each named token's logit, in place."""
    if params.logit_bias:
        ids = torch.tensor([token for token, _ in params.logit_bias], device=logits.device)
        bias = torch.tensor([value for _, value in params.logit_bias], dtype=logits.dtype)
        logits.index_add_(0, ids, bias.to(logits.device))


def _scaled(logits: torch.Tensor, temperatures: torch.Tensor) -> torch.Tensor:
    """Each row of `logits` ([rows, vocab]) over its temperature, in float32, less the row's
    largest value first, so that a tiny temperature gives -inf, never nan: a temperature
    below float32's smallest normal number (1e-300 would round to 0, and 0 / 0 is nan) is
    taken as that number."""
    rows = logits.float()
    smallest = torch.finfo(rows.dtype).tiny
    divisors = temperatures.to(rows.dtype).clamp_min(smallest)[:, None]
    return (rows - rows.amax(dim=-1, keepdim=True)) / divisors


def temperature_probabilities(logits: torch.Tensor, temperatures: torch.Tensor) -> torch.Tensor:
    """The distributions of rows sampled at a temperature alone (no top-k or top-p), all in
    one pass: float32 `[rows, vocab]`. (Float64 row by row cost 0.2 ms a row over SmolLM2's
    vocabulary, 13 ms for 64 rows; this, about 6 ms for the 64.)"""
    return torch.softmax(_scaled(logits, temperatures), dim=-1)


def probabilities(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The distribution a token is sampled from (float32, over the whole vocabulary):
    temperature, then top-k, then the nucleus (top-p) renormalised. Not for greedy."""
    scaled = _scaled(logits[None], torch.tensor([params.temperature]))[0]
    if 0 < params.top_k < scaled.shape[-1]:
        kth = torch.topk(scaled, params.top_k).values[-1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    probs = torch.softmax(scaled, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, sorted_ids = torch.sort(probs, descending=True)
        cumulative = torch.cumsum(sorted_probs, dim=-1)
        # Keep the smallest prefix whose mass reaches top_p (always at least one token).
        outside = cumulative - sorted_probs >= params.top_p
        probs = probs.index_fill(0, sorted_ids[outside], 0.0)
        probs /= probs.sum()
    return probs


def sample_next_token(
    logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None
) -> int:
    """Greedy when temperature is 0, else temperature with top-k and nucleus (top-p) sampling."""
    if params.temperature == 0:
        return int(torch.argmax(logits).item())
    return draw(probabilities(logits, params), generator)


def draw(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """One token drawn from `probs` (`draw_rows` of one row)."""
    return draw_rows(probs[None], [generator])[0]


def draw_rows(probs: torch.Tensor, generators: Sequence[torch.Generator | None]) -> list[int]:
    """One token from each row of `probs` ([rows, vocab], each row's mass need not be 1),
    by inverting the row's cumulative sum at one uniform number from its generator.

    `torch.multinomial` cost 1.3 ms over SmolLM2's 49,152 tokens (about a quarter of a
    decode step); this costs about 0.05 ms a row. The uniform is scaled by the row's mass
    and kept below it, so a token of probability 0 (masked by a grammar, cut by top-p) is
    never drawn.
    """
    cumulative = torch.cumsum(probs, dim=-1)
    uniforms = [torch.rand(1, generator=g, dtype=cumulative.dtype) for g in generators]
    mass = cumulative[:, -1]
    below = torch.nextafter(mass, torch.zeros_like(mass))
    u = torch.minimum(torch.cat(uniforms) * mass, below)
    return torch.searchsorted(cumulative, u[:, None], right=True)[:, 0].tolist()


def token_logprob(logits: torch.Tensor, token_id: int, top: int) -> TokenLogprob:
    """The chosen token's log-probability (before temperature) and the `top` best ones."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    alternatives: tuple[tuple[int, float], ...] = ()
    if top:
        values, ids = torch.topk(logprobs, top)
        # A grammar may leave fewer than `top` tokens possible; the others are not listed.
        alternatives = tuple(
            (token, value)
            for token, value in zip(ids.tolist(), values.tolist(), strict=True)
            if value != float("-inf")
        )
    return TokenLogprob(token_id, float(logprobs[token_id]), alternatives)


def sample_batch(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    outputs: Sequence[Sequence[int]],
    generators: Sequence[torch.Generator | None],
) -> list[tuple[int, TokenLogprob | None]]:
    """One token per row of `logits` ([rows, vocab]); greedy rows share one argmax.

    A grammar's mask, already added, holds -inf where a token is forbidden: no finite
    penalty or bias brings it back, and logprobs are those of the masked distribution,
    the one the token was drawn from.
    """
    for row, (p, out) in enumerate(zip(params, outputs, strict=True)):
        if p.has_penalties:
            apply_penalties(logits[row], out, p)
        apply_logit_bias(logits[row], p)
    tokens: list[int] = logits.argmax(dim=-1).tolist()
    # Rows sampled at a temperature alone share one pass; top-k and top-p go row by row.
    plain: list[int] = []
    for row, p in enumerate(params):
        if p.is_greedy:
            continue
        if p.top_k == 0 and p.top_p >= 1:
            plain.append(row)
        else:
            tokens[row] = sample_next_token(logits[row], p, generators[row])
    if plain:
        temperatures = torch.tensor([params[r].temperature for r in plain])
        probs = temperature_probabilities(logits[plain], temperatures)
        for row, token in zip(plain, draw_rows(probs, [generators[r] for r in plain]), strict=True):
            tokens[row] = token
    results: list[tuple[int, TokenLogprob | None]] = []
    for row, p in enumerate(params):
        token = tokens[row]
        logprob = token_logprob(logits[row], token, p.top_logprobs) if p.logprobs else None
        results.append((token, logprob))
    return results
