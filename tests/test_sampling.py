"""The speculative sampling rule and the sampling transform, as pure functions on synthetic p and q."""

import numpy as np
import pytest

from speclocal.engine.sampling import Sampling, accept_or_resample, probabilities, sample
from speclocal.errors import SpeclocalError

# chi-square critical value, 9 degrees of freedom, p = 0.001
CHI2_9_999 = 27.877


def _chi_square(counts: np.ndarray, p: np.ndarray) -> float:
    expected = counts.sum() * p
    mask = expected > 0
    assert counts[~mask].sum() == 0, "a token with p = 0 was emitted"
    return float(((counts[mask] - expected[mask]) ** 2 / expected[mask]).sum())


def _emitted_distribution(p: np.ndarray, q: np.ndarray, draws: int, seed: int) -> tuple[np.ndarray, float]:
    rng = np.random.default_rng(seed)
    counts = np.zeros(len(p))
    accepted = 0
    for _ in range(draws):
        x = sample(q, rng)
        ok, tok = accept_or_resample(p, q, x, rng)
        accepted += ok
        counts[tok] += 1
    return counts, accepted / draws


@pytest.mark.parametrize(
    "p, q",
    [
        # q puts mass where p has none and none where p has some
        ([0.30, 0.20, 0.15, 0.10, 0.08, 0.07, 0.05, 0.03, 0.02, 0.0], [0.0, 0.0, 0.4, 0.3, 0.1, 0.0, 0.0, 0.0, 0.1, 0.1]),
        # a confident draft that is usually right
        ([0.70, 0.10, 0.05, 0.05, 0.04, 0.03, 0.01, 0.01, 0.01, 0.0], [0.90, 0.05, 0.05, 0, 0, 0, 0, 0, 0, 0]),
        # a point-mass draft (prompt lookup)
        ([0.05, 0.25, 0.10, 0.10, 0.10, 0.10, 0.10, 0.10, 0.05, 0.05], [0, 0, 0, 0, 0, 0, 1.0, 0, 0, 0]),
    ],
)
def test_speculative_sampling_emits_exactly_p(p, q):
    p, q = np.array(p), np.array(q)
    counts, acc_rate = _emitted_distribution(p, q, draws=20_000, seed=1234)
    assert _chi_square(counts, p) < CHI2_9_999
    # acceptance rate equals sum(min(p, q)) (Leviathan et al., eq. for alpha)
    assert acc_rate == pytest.approx(np.minimum(p, q).sum(), abs=0.015)


def test_rule_is_not_trivially_sampling_p():
    """The same test must catch a wrong rule: always accepting the draft emits q, not p."""
    p = np.array([0.5, 0.5, 0, 0, 0, 0, 0, 0, 0, 0])
    q = np.array([0.9, 0.1, 0, 0, 0, 0, 0, 0, 0, 0])
    rng = np.random.default_rng(0)
    counts = np.zeros(10)
    for _ in range(5000):
        counts[sample(q, rng)] += 1
    assert _chi_square(counts, p) > CHI2_9_999


def test_probabilities_greedy_is_one_hot():
    logits = np.array([0.1, 3.0, 2.9, -1.0], dtype=np.float32)
    assert probabilities(logits, Sampling(temp=0)).tolist() == [0, 1, 0, 0]


def test_probabilities_filters_then_applies_temperature():
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.04, 0.01], dtype=np.float32))
    p = probabilities(logits, Sampling(temp=1.0, top_k=0, top_p=1.0, min_p=0.05))
    assert p[4] == 0 and p[3] > 0  # 0.01 is below 0.05 * 0.5, 0.04 is not
    assert p[:4] == pytest.approx(np.array([0.5, 0.3, 0.15, 0.04]) / 0.99)
    p = probabilities(logits, Sampling(temp=1.0, top_k=2, top_p=1.0, min_p=0.0))
    assert np.count_nonzero(p) == 2
    p = probabilities(logits, Sampling(temp=1.0, top_k=0, top_p=0.75, min_p=0.0))
    assert np.count_nonzero(p) == 2  # 0.5 + 0.3 reaches 0.75
    hot = probabilities(logits, Sampling(temp=2.0, top_k=0, top_p=1.0, min_p=0.0))
    cold = probabilities(logits, Sampling(temp=0.5, top_k=0, top_p=1.0, min_p=0.0))
    assert cold[0] > 0.5 > hot[0]
    assert hot.sum() == pytest.approx(1.0) and cold.sum() == pytest.approx(1.0)


def test_negative_temperature_is_refused():
    with pytest.raises(SpeclocalError, match="temp"):
        Sampling(temp=-0.1)
