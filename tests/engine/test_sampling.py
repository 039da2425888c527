"""Token choice: greedy is argmax; seeded sampling repeats; top-p excludes the tail."""

from __future__ import annotations

from collections import Counter

import torch

from engine.sampling import NUCLEUS_CANDIDATES, draw, probabilities, sample_batch, sample_next_token
from engine.types import SamplingParams


def test_greedy_picks_the_argmax() -> None:
    logits = torch.tensor([0.1, 3.0, 2.9, -1.0])
    assert sample_next_token(logits, SamplingParams(temperature=0), None) == 1


def test_same_seed_same_choices() -> None:
    logits = torch.zeros(50)
    params = SamplingParams(temperature=1.0)
    first = [sample_next_token(logits, params, torch.Generator().manual_seed(7)) for _ in range(5)]
    second = [sample_next_token(logits, params, torch.Generator().manual_seed(7)) for _ in range(5)]
    assert first == second


def test_top_p_never_picks_outside_the_nucleus() -> None:
    logits = torch.log(torch.tensor([0.6, 0.3, 0.05, 0.05]))
    params = SamplingParams(temperature=1.0, top_p=0.8)
    generator = torch.Generator().manual_seed(0)
    picks = {sample_next_token(logits, params, generator) for _ in range(300)}
    assert picks == {0, 1}


def test_draws_follow_the_distribution_and_skip_impossible_tokens() -> None:
    probs = torch.zeros(49152, dtype=torch.float64)
    probs[[7, 300, 49151]] = torch.tensor([0.6, 0.3, 0.1], dtype=torch.float64)
    generator = torch.Generator().manual_seed(0)
    counts = Counter(draw(probs, generator) for _ in range(20_000))
    assert set(counts) == {7, 300, 49151}
    for token, p in ((7, 0.6), (300, 0.3), (49151, 0.1)):
        # Five standard deviations of a binomial count.
        assert abs(counts[token] - 20_000 * p) < 5 * (20_000 * p * (1 - p)) ** 0.5


def test_sampled_tokens_follow_the_softmax() -> None:
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0])
    params = SamplingParams(max_tokens=1, temperature=0.5)
    generator = torch.Generator().manual_seed(1)
    counts = Counter(sample_next_token(logits, params, generator) for _ in range(20_000))
    expected = torch.softmax(logits / 0.5, dim=-1).tolist()
    for token, p in enumerate(expected):
        assert abs(counts[token] - 20_000 * p) < 5 * (20_000 * p * (1 - p)) ** 0.5 + 1


def test_rows_sampled_together_follow_their_own_temperatures() -> None:
    """sample_batch draws temperature-only rows in one pass: each row keeps its own
    temperature and generator (the same tokens as drawn alone), beside greedy and top-p rows."""
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]] * 4)
    params = [
        SamplingParams(temperature=0.5),
        SamplingParams(temperature=0),
        SamplingParams(temperature=2.0),
        SamplingParams(temperature=1.0, top_p=0.5),
    ]

    def draws(rows: list[int], times: int) -> list[list[int]]:
        generators = [torch.Generator().manual_seed(row) for row in rows]
        picks: list[list[int]] = [[] for _ in rows]
        for _ in range(times):
            sampled = sample_batch(
                logits[rows].clone(), [params[r] for r in rows], [[] for _ in rows], generators
            )
            for i, (token, _) in enumerate(sampled):
                picks[i].append(token)
        return picks

    together = draws([0, 1, 2, 3], 8_000)
    assert draws([2], 50)[0] == together[2][:50]  # alone or beside others: the same tokens
    assert set(together[1]) == {0} and set(together[3]) == {0}  # greedy; the nucleus of 0.5
    for i, temperature in ((0, 0.5), (2, 2.0)):
        counts = Counter(together[i])
        for token, p in enumerate(torch.softmax(logits[0] / temperature, dim=-1).tolist()):
            assert abs(counts[token] - 8_000 * p) < 5 * (8_000 * p * (1 - p)) ** 0.5 + 1


def test_a_tiny_temperature_samples_the_argmax() -> None:
    """1e-300 rounds to 0 in float32: the sampler must not divide 0 by it (nan)."""
    logits = torch.tensor([[0.5, 3.0, 2.9, -1.0]] * 2)
    params = [SamplingParams(temperature=1e-300), SamplingParams(temperature=1e-300, top_p=0.9)]
    generators = [torch.Generator().manual_seed(0), torch.Generator().manual_seed(1)]
    for _ in range(20):
        sampled = sample_batch(logits.clone(), params, [[], []], generators)
        assert [token for token, _ in sampled] == [1, 1]


def full_sort_nucleus(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """The nucleus as a sort of the whole vocabulary gives it (the definition)."""
    sorted_probs, sorted_ids = torch.sort(probs, descending=True)
    outside = torch.cumsum(sorted_probs, dim=-1) - sorted_probs >= top_p
    kept = probs.index_fill(0, sorted_ids[outside], 0.0)
    return kept / kept.sum()


def test_the_nucleus_from_the_likeliest_candidates_is_the_full_sorts() -> None:
    """Peaked rows (the nucleus among the candidates) and flat ones (sorted whole) keep
    the same tokens, with the same probabilities, as a sort of the whole vocabulary."""
    generator = torch.Generator().manual_seed(5)
    for spread, top_p in ((8.0, 0.9), (8.0, 0.5), (0.3, 0.9), (0.3, 0.99)):
        logits = torch.randn(49152, generator=generator) * spread
        params = SamplingParams(temperature=1.0, top_p=top_p)
        ours = probabilities(logits, params)
        expected = full_sort_nucleus(torch.softmax(logits, dim=-1), top_p)
        assert torch.equal(ours > 0, expected > 0)
        torch.testing.assert_close(ours, expected)
    # One flat row needs more tokens than the candidates hold.
    flat = full_sort_nucleus(torch.softmax(torch.randn(49152, generator=generator) * 0.3, -1), 0.9)
    assert int((flat > 0).sum()) > NUCLEUS_CANDIDATES


def test_rows_of_each_kind_in_one_batch_get_their_own_choice() -> None:
    """Greedy rows take the argmax of their own row (not of a batch-wide pass), beside
    sampled ones; a certain token is drawn whatever the generator."""
    logits = torch.full((4, 10), -5.0)
    for row, token in enumerate((3, 7, 1, 9)):
        logits[row, token] = 20.0
    params = [
        SamplingParams(temperature=0),
        SamplingParams(temperature=0.8),
        SamplingParams(temperature=0),
        SamplingParams(temperature=1.0, top_p=0.5),
    ]
    generators = [torch.Generator().manual_seed(row) for row in range(4)]
    sampled = sample_batch(logits.clone(), params, [[] for _ in params], generators)
    assert [token for token, _ in sampled] == [3, 7, 1, 9]
