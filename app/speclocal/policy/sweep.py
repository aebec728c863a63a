"""Checking the cost model at any acceptance: speedup measured with a synthetic drafter (the main model's own
continuation, right at a chosen rate) against the cost model's prediction, over a grid of acceptance x k.
Real prompts never give acceptance 1.0 or exactly 0.5; this does, on whatever machine it runs."""

from __future__ import annotations

import statistics

from speclocal.engine import DraftParams, Engine, GenerationRequest
from speclocal.engine.drafters import SyntheticDrafter
from speclocal.policy.costmodel import CostCurve, DraftCost, acceptance_mle, predicted_run_speedup

PROMPT = ("Write a Python class `Inventory` with methods to add an item with a quantity, remove some, and report "
          "what is low on stock. Include docstrings.")
RATES = (0.0, 0.5, 0.8, 0.9, 1.0)
KS = (1, 3, 8, 16)


def synthetic_sweep(engine: Engine, curve: CostCurve, rates=RATES, ks=KS, n_predict: int = 48,
                    charge_draft_model: bool = False, prompt: str = PROMPT) -> dict:
    """For each k and acceptance rate: plain, the synthetic drafter, plain again (greedy, fresh caches); the
    measured speedup over the mean of the two plain runs, and the cost model's prediction from the run's own
    steps (their draft lengths, the acceptance they show) on `curve`. With `charge_draft_model` each step also
    runs the real draft model for its length, so drafting costs what the draft model costs."""
    messages = ({"role": "user", "content": prompt},)

    def run(mode: str, k: int = 1, drafter=None):
        req = GenerationRequest(messages=messages, mode=mode, n_predict=n_predict,
                                draft=DraftParams(max=k, lookup_max=k))
        engine.reset()
        return engine.generate(req, drafter=drafter)

    reference = run("plain").tokens  # the main model's own greedy continuation (and a warm-up)
    cost = curve.cost_of("model") if charge_draft_model else DraftCost()
    rows = []
    for k in ks:
        for rate in rates:
            charge = engine.model_drafter(GenerationRequest(messages=messages, draft=DraftParams(max=k))) \
                if charge_draft_model else None
            before = run("plain")
            synth = run("spec" if charge_draft_model else "lookup", k,
                        SyntheticDrafter(reference, rate, engine.main.n_vocab, seed=k * 100 + int(rate * 100),
                                         charge=charge))
            after = run("plain")
            plain_tps = (before.decode_tps + after.decode_tps) / 2
            a = acceptance_mle(synth.steps)
            predicted = predicted_run_speedup(a if a is not None else 0.0, [s[1] for s in synth.steps], cost, curve)
            measured = synth.decode_tps / plain_tps
            rows.append({"k": k, "rate": rate, "acceptance": synth.acceptance, "acceptance_mle": a,
                         "tokens_per_pass": synth.tokens_per_pass, "measured": measured, "predicted": predicted,
                         "error": (predicted - measured) / measured})
    errors = [abs(r["error"]) for r in rows]
    return {"rows": rows, "median_abs_error": statistics.median(errors), "max_abs_error": max(errors),
            "charge_draft_model": charge_draft_model, "n_predict": n_predict}
