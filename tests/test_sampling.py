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


@pytest.mark.parametrize("source", ["draft model", "prompt lookup"])
def test_the_engines_accept_path_emits_p_at_every_position(source):
    """Through the engine's multi-position accept (two drafted tokens, rows from a real-sized sampling transform):
    the first emitted token follows p0, and the second, emitted when the first draft was accepted, follows p1;
    q is the draft model's distribution or a point mass (prompt lookup)."""
    from speclocal.engine.drafting.base import Proposal
    from speclocal.engine.verify import accept_one
    from speclocal.engine.sampling import distribution

    s = Sampling(temp=0.9, top_k=0, top_p=0.95, min_p=0.05)
    gen = np.random.default_rng(5)
    rows = gen.normal(0, 1.5, size=(3, 10)).astype(np.float32)  # the main model's logits at 3 positions
    p = [distribution(r, s) for r in rows]
    q_logits = rows[:2] + gen.normal(0, 1.0, size=(2, 10)).astype(np.float32)  # a draft that roughly agrees
    q = [distribution(r, s) for r in q_logits]
    rng = np.random.default_rng(99)
    first, second = np.zeros(10), np.zeros(10)
    for _ in range(20_000):
        if source == "draft model":
            x = [int(sample(q[0], rng)), int(sample(q[1], rng))]
            draft = Proposal(x, q)
        else:  # a fixed proposal: lookup copies the same tokens every time
            x = [int(p[0].ids[np.argmax(p[0].probs)]), int(p[1].ids[np.argmax(p[1].probs)])]
            draft = Proposal(x)
        new, _ = accept_one(rows, draft, s, rng)
        first[new[0]] += 1
        if len(new) > 1:
            second[new[1]] += 1
    assert _chi_square(first, p[0].dense(10)) < CHI2_9_999
    assert second.sum() > 2000 and _chi_square(second, p[1].dense(10)) < CHI2_9_999


def test_sparse_distribution_equals_the_dense_transform_on_a_full_vocabulary():
    """Qwen's 151,936-token vocabulary: the sparse transform keeps the same ids with the same probabilities as
    the dense definition (top-k, then top-p and min-p on the softmax, then temperature), for every filter mix."""
    from speclocal.engine.sampling import distribution

    def dense(logits, s):  # the definition, sorting the whole vocabulary
        n = len(logits)
        k = s.top_k if 0 < s.top_k < n else n
        ids = np.argsort(-logits, kind="stable")[:k]
        kept = logits[ids].astype(np.float64)
        p1 = np.exp(kept - kept[0])
        p1 /= p1.sum()
        keep = int(np.searchsorted(np.cumsum(p1), s.top_p) + 1) if s.top_p < 1 else len(ids)
        keep = max(1, min(keep, int(np.count_nonzero(p1 >= s.min_p * p1[0]))))
        pt = np.exp((kept[:keep] - kept[0]) / s.temp)
        out = np.zeros(n)
        out[ids[:keep]] = pt / pt.sum()
        return out

    logits = np.random.default_rng(3).normal(0, 3, 151_936).astype(np.float32)
    for top_k, top_p, min_p in ((40, 0.95, 0.05), (0, 0.95, 0.05), (0, 0.9, 0.0), (0, 1.0, 0.1), (500, 1.0, 0.0)):
        s = Sampling(temp=0.8, top_k=top_k, top_p=top_p, min_p=min_p)
        d = distribution(logits, s)
        assert np.all(np.diff(d.ids) > 0) and d.probs.sum() == pytest.approx(1.0)
        assert d.dense(len(logits)) == pytest.approx(dense(logits, s), abs=1e-12), (top_k, top_p, min_p)


def _candidates(row: np.ndarray, k: int, gen: np.random.Generator):
    """A row as llama.cpp's backend top-k hands it back: its k best ids and their logits, in no order."""
    from speclocal.engine.sampling import Candidates

    ids = gen.permutation(np.argsort(-row, kind="stable")[:k])
    return Candidates(ids.astype(np.int64), row[ids].copy())


def test_a_rows_device_candidates_give_the_distribution_its_full_logits_give():
    """Sampling on the device: from the top-k candidates alone, `distribution` keeps the same ids with the same
    probabilities as from the whole row, for every filter mix with top-k on; greedy takes the same argmax;
    --draft-p-min reads the same probability; fewer candidates than the top-k is refused, not guessed."""
    from speclocal.engine.sampling import device_top_k, distribution, top_probability

    gen = np.random.default_rng(8)
    row = gen.normal(0, 3, 151_936).astype(np.float32)
    for top_k, top_p, min_p, temp in ((40, 0.95, 0.05, 0.8), (40, 1.0, 0.0, 1.5), (10, 0.5, 0.0, 0.3),
                                      (200, 0.99, 0.01, 1.0), (1, 1.0, 0.0, 0.7), (40, 0.95, 0.05, 0.0)):
        s = Sampling(temp=temp, top_k=top_k, top_p=top_p, min_p=min_p)
        k = device_top_k(s)
        assert k == max(top_k, 10)
        cand = _candidates(row, k, gen)
        full, top = distribution(row, s), distribution(cand, s)
        assert np.array_equal(full.ids, top.ids) and top.probs == pytest.approx(full.probs, abs=1e-12), s
    assert cand.argmax() == int(row.argmax())
    assert top_probability(cand) == pytest.approx(top_probability(row))
    assert device_top_k(Sampling(temp=0.8, top_k=0)) is None and device_top_k(Sampling(temp=0, top_k=0)) == 10
    assert device_top_k(Sampling(temp=0.8, top_k=1000)) is None  # too many to pay: full rows
    with pytest.raises(ValueError):
        distribution(_candidates(row, 20, gen), Sampling(temp=0.8, top_k=40))


def test_the_lossless_rule_emits_p_through_rows_sampled_on_the_device():
    """The engine's accept path on rows that are device candidates (top-6 of 10 ids handed back as 8): the
    first emitted token follows p0 and the second p1, both from the full rows, with a draft model's q."""
    from speclocal.engine.drafting.base import Proposal
    from speclocal.engine.sampling import distribution
    from speclocal.engine.verify import accept_one

    s = Sampling(temp=0.9, top_k=6, top_p=0.95, min_p=0.02)
    gen = np.random.default_rng(6)
    full = gen.normal(0, 1.5, size=(3, 10)).astype(np.float32)
    rows = [_candidates(r, 8, gen) for r in full]
    p = [distribution(r, s) for r in full]
    q = [distribution(r + gen.normal(0, 1.0, 10).astype(np.float32), s) for r in full[:2]]
    rng = np.random.default_rng(98)
    first, second = np.zeros(10), np.zeros(10)
    for _ in range(20_000):
        x = [int(sample(q[0], rng)), int(sample(q[1], rng))]
        new, _ = accept_one(rows, Proposal(x, q), s, rng)
        first[new[0]] += 1
        if len(new) > 1:
            second[new[1]] += 1
    assert _chi_square(first, p[0].dense(10)) < CHI2_9_999
    assert second.sum() > 2000 and _chi_square(second, p[1].dense(10)) < CHI2_9_999
