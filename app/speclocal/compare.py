"""Plain against another mode on one prompt: both results, the speedups and, when greedy, the agreement."""

from __future__ import annotations

import threading
from typing import Callable

from speclocal.engine import Engine, GenerationRequest, GenerationResult
from speclocal.engine.equivalence import NEAR_TIE, compare_outputs


def compare(engine: Engine, plain_req: GenerationRequest, other_req: GenerationRequest,
            on_step=None, cancel: threading.Event | None = None,
            before: Callable[[GenerationRequest], None] | None = None,
            after: Callable[[GenerationResult], None] | None = None) -> dict:
    """Plain then the other mode on the same prompt, caches cleared before each; never concurrent (`before` and
    `after` are called around each run). Fair with the suffix store on: plain never adds to it, so the other
    mode cannot copy plain's answer from it. "equivalence" is there when greedy."""
    runs = []
    for req in (plain_req, other_req):
        engine.reset()
        if before is not None:
            before(req)
        runs.append(engine.generate(req, on_step=on_step, cancel=cancel))
        if after is not None:
            after(runs[-1])
        if runs[-1].stop_reason == "cancelled":
            return {"runs": runs}
    plain, other = runs
    out = {"runs": runs, "speedup": other.decode_tps / plain.decode_tps if plain.decode_tps else None,
           "speedup_e2e": other.e2e_speedup_over(plain)}
    if plain_req.sampling.greedy:
        out["equivalence"] = compare_outputs(engine, engine.prompt_tokens(plain_req), plain.tokens, other.tokens)
    return out


def report_json(report: dict, engine: Engine) -> dict:
    """A `compare` report (or {"runs": [one result]}) as `--json` prints it, with what ran it."""
    out = {
        "main": str(engine.main.path),
        "draft": str(engine.draft.path) if engine.draft else None,
        "n_ctx": engine.main.n_ctx,
        "threads": engine.n_threads,
        "compute": engine.compute,  # which backend and device ran it
        "layout": engine.layout.layout,  # how the weights were laid out (speclocal.models.layout)
        "backend_sampling": engine.backend_sampling,  # rows' top-k selected on the device (-bs)
        "n_prompt": report["runs"][0].n_prompt,
        "runs": [r.to_dict() for r in report["runs"]],
    }
    for key in ("speedup", "speedup_e2e"):
        if key in report:
            out[key] = report[key]
    for run, result in zip(out["runs"], report["runs"]):
        run.update(t_total=result.t_total, e2e_tps=result.e2e_tps)
    if "equivalence" in report:
        out["equivalence"] = dict(vars(report["equivalence"]), near_tie_threshold=NEAR_TIE)
    return out
