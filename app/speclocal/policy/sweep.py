"""Checking the cost model at any acceptance: speedup measured with a synthetic drafter (the main model's own
continuation, right at a chosen rate) against the cost model's prediction, over a grid of acceptance x k.
Real prompts never give acceptance 1.0 or exactly 0.5; this does, on whatever machine it runs."""

from __future__ import annotations

import statistics
from typing import Callable

from speclocal.engine import DraftParams, Engine, GenerationRequest
from speclocal.engine.drafting.synthetic import SyntheticDrafter
from speclocal.policy.costmodel import CostCurve, DraftCost, acceptance_mle, predicted_run_speedup

PROMPT = ("Write a Python class `Inventory` with methods to add an item with a quantity, remove some, and report "
          "what is low on stock. Include docstrings.")
RATES = (0.0, 0.5, 0.8, 0.9, 1.0)
KS = (1, 3, 8, 16)


def _before_parting(result, reference: list[int]) -> list[tuple]:
    """The steps of a run whose tokens all agree with `reference`: greedy outputs may part where the top two
    logits nearly tie (a batched pass rounds differently from a single decode); past that point the synthetic
    drafter proposes the wrong text, so its acceptance is no longer the rate set."""
    n = next((i for i, (a, b) in enumerate(zip(result.tokens, reference)) if a != b),
             min(len(result.tokens), len(reference)))
    steps, total = [], 0
    for st in result.steps:
        total += st[0]
        if total > n:
            break
        steps.append(st)
    return steps


def _tps(steps: list[tuple]) -> float:
    """Decode tokens per second over these steps (tokens, drafted, accepted, time since decoding began)."""
    return sum(st[0] for st in steps) / steps[-1][3] if steps and steps[-1][3] > 0 else 0.0


def synthetic_sweep(engine: Engine, curve: CostCurve, rates=RATES, ks=KS, n_predict: int = 48,
                    charge_draft_model: bool = False, prompt: str = PROMPT,
                    remeasure: Callable[[], CostCurve] | None = None) -> dict:
    """For each k and acceptance rate: plain, the synthetic drafter, plain again (greedy, fresh caches); the
    measured speedup over the mean of the two plain runs, and the cost model's prediction from the run's own
    steps (their draft lengths, the acceptance they show) on `curve`, both over the synthetic run's steps
    before its output parted from plain's (`tokens`; a near tie, see `_before_parting`). `remeasure`: a fresh
    profile before each draft length's cells after the first, which use `curve` (the caller's, measured just
    before: a shared machine's relative costs drift within minutes), so each prediction uses costs measured
    within about a minute of the runs it predicts. With `charge_draft_model`
    each step also runs the real draft model for its length, so drafting costs what the draft model costs."""
    messages = ({"role": "user", "content": prompt},)

    def run(mode: str, k: int = 1, drafter=None):
        req = GenerationRequest(messages=messages, mode=mode, n_predict=n_predict,
                                draft=DraftParams(max=k, lookup_max=k))
        engine.reset()
        return engine.generate(req, drafter=drafter)

    reference = run("plain").tokens  # the main model's own greedy continuation (and a warm-up)
    rows = []
    for i, k in enumerate(ks):
        if remeasure is not None and i > 0:
            curve = remeasure()
        cost = curve.cost_of("model") if charge_draft_model else DraftCost()
        for rate in rates:
            charge = engine.model_drafter(GenerationRequest(messages=messages, draft=DraftParams(max=k))) \
                if charge_draft_model else None
            before = run("plain")
            synth = run("spec" if charge_draft_model else "lookup", k,
                        SyntheticDrafter(reference, rate, engine.main.n_vocab, seed=k * 100 + int(rate * 100),
                                         charge=charge))
            after = run("plain")
            plain_tps = (_tps(before.steps) + _tps(after.steps)) / 2
            steps = _before_parting(synth, reference)
            n = sum(st[0] for st in steps)
            drafted, accepted = sum(st[1] for st in steps), sum(st[2] for st in steps)
            a = acceptance_mle(steps)
            row = {"k": k, "rate": rate, "V": curve.V(k + 1), "tokens": n,
                   "acceptance": accepted / drafted if drafted else None, "acceptance_mle": a, "tokens_per_pass": n / len(steps) if steps else None,
                   "measured": None, "predicted": None, "error": None}
            if steps and plain_tps > 0:
                row["measured"] = _tps(steps) / plain_tps
                row["predicted"] = predicted_run_speedup(a if a is not None else 0.0, [st[1] for st in steps], cost,
                                                         curve)
                row["error"] = (row["predicted"] - row["measured"]) / row["measured"]
            rows.append(row)
    errors = [abs(r["error"]) for r in rows if r["error"] is not None]
    return {"rows": rows, "median_abs_error": statistics.median(errors) if errors else None,
            "max_abs_error": max(errors) if errors else None,
            "charge_draft_model": charge_draft_model, "n_predict": n_predict}
