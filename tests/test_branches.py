"""A draft with a second candidate, verified in the same main-model pass: the cost model that decides it, the
lossless accept rule, the two KV sequences through the real llama.cpp, and the engine's greedy equivalence."""

from __future__ import annotations

import numpy as np
import pytest

from speclocal.engine import Engine, GenerationRequest
from speclocal.drafts import Source
from speclocal.engine.drafting.base import Drafter, DraftParams, Proposal
from speclocal.engine.equivalence import compare_outputs
from speclocal.engine.verify import accept_branches
from speclocal.engine.llama import LoadedModel
from speclocal.engine.sampling import Sampling, distribution
from speclocal.engine.drafting.suffix import SuffixDrafter
from speclocal.policy.auto import DEFAULT_PRIORS, AutoDrafter
from speclocal.policy.costmodel import best_prefix, best_tree, memory_bound_curve

from test_policy import brief_cpu_curve
from test_sampling import CHI2_9_999, _chi_square

ROUNDING = 1.0  # logits: what evaluating the same tokens in another batch shape may move (NEAR_TIE is a margin)


# ---- when a second candidate pays ------------------------------------------------------------------
def test_a_runner_up_pays_on_a_flat_curve_and_not_on_this_cpus():
    q = [0.5, 0.45, 0.4]  # the first token is a coin toss: the runner-up there is as likely
    alt = [0.45, 0.4, 0.35]
    flat = memory_bound_curve()
    k, m, s = best_tree(q, 0, alt, 0.0, flat)
    assert (k, m) == (3, 3) and s > best_prefix(q, 0.0, flat)[1] * 1.2
    steep = brief_cpu_curve()
    assert best_tree(q, 0, alt, 0.0, steep)[1] == 0  # its rows cost more than its tokens bring
    assert best_tree(q, 0, alt, 0.0, steep)[:2] == best_prefix(q, 0.0, steep)[:1] + (0,)
    assert best_tree(q, 3, alt, 0.0, flat)[1] == 0  # it leaves after the drafted tokens: nothing to add
    assert sum(best_tree(q, 0, alt, 0.0, flat, k_cap=4)[:2]) == 4  # the cap counts both candidates


def _ambiguous_context() -> list[int]:
    """A context where `5 6 7` was followed three times by `8 20 21` and twice by `9 30 31`."""
    seq = []
    for pre, cont in [(1, [8, 20, 21]), (2, [9, 30, 31]), (3, [8, 20, 21]), (4, [9, 30, 31]), (40, [8, 20, 21])]:
        seq += [pre, 5, 6, 7] + cont
    return seq + [0, 5, 6, 7]


@pytest.mark.parametrize("curve, branch", [(memory_bound_curve(), True), (brief_cpu_curve(), False)])
def test_auto_verifies_the_suffix_drafters_runner_up_only_where_the_curve_says(curve, branch):
    p = DraftParams(lookup_max=6)
    auto = AutoDrafter(curve, "edit", None, None, priors={t: dict(v) for t, v in DEFAULT_PRIORS.items()},
                       suffix=SuffixDrafter(p, copy=False))  # the suffix counts' two branches, not a copy
    auto.calibration = {c: type(x)(prior=1.0) for c, x in auto.calibration.items()}  # take the counts as they are
    seq = _ambiguous_context()
    auto.prepare(seq)
    d = auto.draft(seq, 6, Sampling(), np.random.default_rng(0))
    if branch:
        assert d.tokens == [8, 20, 21] and d.runner_up.tokens == [9, 30, 31] and d.runner_up.at == 0
        assert auto.explain()["second_candidates"] == {"verified": 1, "followed": 0}
    else:
        assert not d.runner_up and auto.last.branch == 0


# ---- the accept rule ----------------------------------------------------------------------------
def test_the_two_candidate_rule_emits_p_at_every_position():
    """Point-mass candidates [a0, a1] and [b0, b1] leaving each other at 0: the first token follows p at the
    pending row, the second follows the row of whichever candidate the first token matched."""
    s = Sampling(temp=0.9, top_k=0, top_p=0.95, min_p=0.05)
    gen = np.random.default_rng(7)
    rows = gen.normal(0, 1.2, size=(5, 10)).astype(np.float32)  # pending, a0, a1, b0, b1
    p = [distribution(r, s) for r in rows]
    order = np.argsort(-p[0].dense(10))
    a0, b0 = int(order[0]), int(order[1])
    draft = Proposal([a0, 3], source=Source.SUFFIX, runner_up=Proposal([b0, 4], at=0))
    rng = np.random.default_rng(11)
    first, after_a, after_b = np.zeros(10), np.zeros(10), np.zeros(10)
    followed = 0
    for _ in range(20_000):
        new, n_acc, on_branch = accept_branches(rows, draft, s, rng)
        assert n_acc == len(new) - 1 and (on_branch == (new[0] == b0))
        first[new[0]] += 1
        followed += on_branch
        if len(new) > 1:
            (after_b if on_branch else after_a)[new[1]] += 1
    assert _chi_square(first, p[0].dense(10)) < CHI2_9_999
    assert after_a.sum() > 2000 and _chi_square(after_a, p[1].dense(10)) < CHI2_9_999
    assert after_b.sum() > 2000 and _chi_square(after_b, p[3].dense(10)) < CHI2_9_999
    assert followed == pytest.approx(20_000 * p[0].dense(10)[b0], rel=0.1)


def two(first: list[int], second: list[int], at: int) -> Proposal:
    """A suffix proposal `first` with the runner-up `second` leaving it at `at`."""
    return Proposal(first, source=Source.SUFFIX, runner_up=Proposal(second, at=at))


def test_the_rule_walks_greedy_rows_down_the_matching_candidate():
    rows = np.zeros((6, 10), dtype=np.float32)
    for r, t in enumerate([5, 6, 7, 1, 8, 9]):  # argmax per row: pending, a0, a1, a2, b0, b1
        rows[r, t] = 1.0
    # a = [5, 2, 3] (agrees on 5, then the main model says 6: the branch [6, 8] leaving at 1 has it)
    new, n_acc, on_branch = accept_branches(rows, two([5, 2, 3], [6, 8], 1), Sampling(), None)
    assert (new, n_acc, on_branch) == ([5, 6, 8, 9], 3, True)
    new, n_acc, on_branch = accept_branches(rows, two([5, 6, 7], [4, 4], 1), Sampling(), None)
    assert (new, n_acc, on_branch) == ([5, 6, 7, 1], 3, False)


# ---- the two sequences in llama.cpp --------------------------------------------------------------
def test_two_candidates_in_one_pass_give_each_ones_own_rows_and_cache(smollm2):
    m = LoadedModel(smollm2, 512, 2, n_seq=2)
    try:
        prompt = m.tokenize("def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return", add_special=True)
        head, pending = prompt[:-1], prompt[-1]
        a = m.tokenize(" a - b\n", add_special=False)
        b = m.tokenize(" b - a + 1", add_special=False)
        assert a[0] != b[0]
        m.eval(head, outputs="none")
        rows = m.eval_branches([pending] + a, 0, b).copy()
        m.keep_branch(True)
        assert m.tokens == head + [pending] + b and m.kv_positions() == len(m.tokens)
        nl = m.tokenize("\n", add_special=False)[0]
        nxt = m.eval([nl], outputs="last").copy()

        def chain(candidate: list[int]) -> tuple[np.ndarray, np.ndarray]:
            """Rows of the candidate verified alone, and of the next token after it, from a fresh cache."""
            m.clear()
            m.eval(head, outputs="none")
            rows = m.eval([pending] + candidate).copy()
            return rows, m.eval([nl], outputs="last").copy()

        (chain_a, after_a), (chain_b, after_b) = chain(a), chain(b)

        def gap(x, y) -> float:
            assert x.shape == y.shape
            return float(np.abs(x - y).max())

        # equal up to the rounding of a differently shaped batch (seen: 0.6 logits); another context: 17
        assert gap(rows[: 1 + len(a)], chain_a) < ROUNDING and gap(rows[1 + len(a):], chain_b[1:]) < ROUNDING
        assert gap(nxt, after_b) < ROUNDING < 10 * ROUNDING < gap(nxt, after_a)  # the kept candidate's cache

        m.clear()  # and with the first candidate kept, the second leaves no trace
        m.eval(head, outputs="none")
        m.eval_branches([pending] + a, 1, b[:2])
        m.keep_branch(False)
        assert m.tokens == head + [pending] + a and m.kv_positions() == len(m.tokens)
        m.truncate(len(head) + 2)
        assert m.kv_positions() == len(head) + 2
    finally:
        m.close()


class TwoCandidates(Drafter):
    """Proposes plain's own continuation (`reference`) and a copy of it with one token wrong, as the two
    candidates of each step, taking turns at which one is the first."""

    def __init__(self, reference: list[int], n_vocab: int, k: int = 4, at: int = 1):
        self.reference, self.n_vocab, self.k, self.at = reference, n_vocab, k, at
        self.followed: list[bool] = []

    def prepare(self, prompt: list[int]) -> None:
        self.n_prompt = len(prompt)

    def draft(self, history, k, sampling, rng) -> Proposal:
        pos = len(history) - self.n_prompt
        truth = self.reference[pos : pos + min(k, self.k)]
        if len(truth) <= self.at:
            return Proposal(truth, source=Source.SYNTHETIC)
        wrong = truth[: self.at] + [(truth[self.at] + 1) % self.n_vocab] + truth[self.at + 1:]
        first, second = (truth, wrong) if len(self.followed) % 2 else (wrong, truth)
        return Proposal(first, source=Source.SYNTHETIC, runner_up=Proposal(second[self.at:], at=self.at))

    def observe(self, drafted, accepted, on_branch=False) -> None:
        self.followed.append(on_branch)


def test_the_engine_verifying_two_candidates_gives_plains_output(smollm2):
    engine = Engine(smollm2, None, n_ctx=1024)
    try:
        req = GenerationRequest(messages=({"role": "user", "content": "List five fruits, one per line."},),
                                mode="lookup", n_predict=48)
        plain = engine.generate(GenerationRequest(messages=req.messages, mode="plain", n_predict=48))
        engine.reset()
        drafter = TwoCandidates(plain.tokens, engine.main.n_vocab)
        got = engine.generate(req, drafter=drafter)
        engine.check_kv()
        eq = compare_outputs(engine, engine.prompt_tokens(req), plain.tokens, got.tokens)
        assert eq.identical or eq.near_tie, eq
        assert True in drafter.followed and False in drafter.followed
        assert got.n_passes < 0.5 * plain.n_passes  # the right candidate was accepted, whichever it was
        assert got.n_drafted == sum(s[1] for s in got.steps) and got.n_accepted <= got.n_drafted
    finally:
        engine.close()


def test_a_sliding_window_model_keeps_one_sequence(gemma3):
    """A second sequence would double Gemma 3's window cache: it is loaded with one, and says so when asked for two
    candidates."""
    from speclocal.errors import SpeclocalError

    m = LoadedModel(gemma3, 1024, 2, n_seq=2)
    try:
        assert m.memory_kind == "swa" and m.n_seq == 1
        m.eval(m.tokenize("Hello there", add_special=True), outputs="none")
        with pytest.raises(SpeclocalError, match="one sequence"):
            m.eval_branches([1, 2, 3], 0, [4])
    finally:
        m.close()
