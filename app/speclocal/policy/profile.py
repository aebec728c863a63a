"""Measure this machine's cost curve for a loaded pair (`speclocal profile`), cached per setup."""

from __future__ import annotations

import hashlib
import json
import logging
import platform
import statistics
import time
import weakref
from pathlib import Path

import psutil

from speclocal import locations
from speclocal.errors import SpeclocalError
from speclocal.files import atomic_write, read_json, set_aside
from speclocal.models.cpu import cpu_id
from speclocal.policy.costmodel import CONTEXT_POS, K_MAX, LONG_N, CostCurve, Depth

log = logging.getLogger(__name__)

# 2: single decodes and the draft model timed in runs, as generation steps run them; 3: suffix; 4: the draft model's
# prompt processing, and c deeper in the context; 5: V(n) deeper in the context too; 6: at two depths
PROFILE_VERSION = 6
STALE_DAYS = 30
REPS = 9  # medians of 9 round-robin passes: with fewer, a loaded machine's noise moves V(n) between runs
RUN = 4  # decodes in a row per timed run (plain steps; a draft of this length)
# the depths V(n) and c are measured again at (each at most 3/4 of the context): what long prompts pay. A line
# through one depth is not enough: past ~2,000 tokens a pass's time grows faster than linearly on the Intel Xeon
# (AMX) and slower on the AMD EPYC (AVX2); a line extrapolated from two close depths amplifies the noise
DEEP_POS = (1024, 3072)


def machine_id() -> str:
    """This machine as its cost curve depends on it: the CPU (`cpu_id`), its threads and the OS."""
    return f"{cpu_id()} | {psutil.cpu_count(logical=True)} threads | {platform.system()}"


def _file_key(path: Path) -> str:
    st = path.stat()
    return f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}"


def profile_key(engine) -> str:
    import llama_cpp

    parts = [
        _file_key(engine.main.path), _file_key(engine.draft.path) if engine.draft else "-",
        str(engine.n_threads), str(engine.n_gpu_layers), engine.compute, machine_id(), llama_cpp.__version__,
        str(PROFILE_VERSION),
    ]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:20]


def _median_times(fns: list, reps: int) -> list[float]:
    """Median time of each function, measured round-robin so a burst of load hits all of them alike."""
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(reps):
        for i, fn in enumerate(fns):
            t0 = time.perf_counter()
            fn()
            times[i].append(time.perf_counter() - t0)
    return [statistics.median(t) for t in times]


def measure(engine, reps: int = REPS, k_max: int = K_MAX) -> CostCurve:
    """Time the main model's single-token decoding and its passes over n = 2..k_max+1 tokens, the draft model,
    prompt lookup and the suffix drafter, each the way a generation step does it: decodes in a row at a
    realistic context position, the draft model through the drafter itself (catching up on the pending token,
    then drafting), every pass followed by the rollback a step does; the model-free drafters one proposal
    (a call) each, over the same ~1,700-token history (the suffix drafter over its live context only: its
    store adds a few binary searches per call, `scripts/suffix_cost.py`); then the draft model's prompt processing
    and both models' decodes at each of DEEP_POS (`_measure_deep`)."""
    t_start = time.perf_counter()
    main = engine.main
    filler = _filler(engine)
    fns = _step_functions(engine, filler, k_max)
    d = engine.draft
    for fn in fns:  # warm-up
        fn()
    times = _median_times(fns, reps)
    t1 = times[0] / RUN
    verify_costs = (1.0,) + tuple(t / t1 for t in times[1 : k_max + 1])
    draft_cost = times[k_max + 1] / RUN / t1 if d is not None else float("inf")
    lookup_cost = times[-2] / t1
    suffix_cost = times[-1] / t1
    deep = _measure_deep(engine, filler, deep_positions(main.n_ctx), reps, t1)
    engine.reset()
    meta = {
        "main": str(main.path), "draft": str(engine.draft.path) if engine.draft else None,
        "threads": engine.n_threads, "n_gpu_layers": engine.n_gpu_layers, "compute": engine.compute,
        "layout": engine.layout.layout, "machine": machine_id(),
        "measured_at": time.time(), "seconds": round(time.perf_counter() - t_start, 1), "reps": reps,
    }
    return CostCurve(verify_costs, draft_cost, lookup_cost, t1, meta, suffix_cost, **deep)


def draft_cost(engine, reps: int = REPS) -> float:
    """The draft model's c alone, timed as `measure` times it: RUN draft tokens against RUN plain decodes,
    round-robin, CONTEXT_POS deep (`speclocal drafts`: the main model's curve is measured once, c per draft)."""
    fns = _step_functions(engine, _filler(engine), RUN)  # k_max >= RUN - 1: the plain run has RUN tokens to decode
    pair = [fns[0], fns[RUN + 1]]  # the plain decodes and the draft model's run
    for fn in pair:  # warm-up
        fn()
    t_decode, t_draft = _median_times(pair, reps)
    engine.reset()
    return t_draft / t_decode


def _filler(engine) -> list[int]:
    """The history `measure` times steps over, the main model holding its first CONTEXT_POS tokens (caches reset)."""
    filler = engine.main.tokenize("def f(x):\n    return x * 2\n" * 40, add_special=False)
    engine.reset()
    engine.main.eval(filler[:CONTEXT_POS], outputs="none")
    return filler


def _step_functions(engine, filler: list[int], k_max: int) -> list:
    """What `measure` times, with the main model holding `filler[:CONTEXT_POS]`: RUN plain decodes, a verifying
    pass over each of 2 .. k_max + 1 tokens, RUN draft-model tokens (with a draft model), one prompt-lookup and
    one suffix-drafter proposal."""
    from speclocal.engine.drafting.base import DraftParams
    from speclocal.engine.drafting.lookup import PromptLookupDrafter
    from speclocal.engine.drafting.model import ModelDrafter
    from speclocal.engine.drafting.suffix import SuffixDrafter
    from speclocal.engine.sampling import Sampling

    main = engine.main
    probe = filler[CONTEXT_POS : CONTEXT_POS + k_max + 1]

    def decode_run() -> None:  # plain decoding: one token per pass, RUN passes in a row
        for tok in probe[:RUN]:
            main.eval([tok], outputs="all").argmax(axis=1)
        main.truncate(CONTEXT_POS)

    def verify(n: int) -> None:  # one verifying pass over n tokens, then the rollback of a rejection
        main.eval(probe[:n], outputs="all").argmax(axis=1)
        main.truncate(CONTEXT_POS)

    fns = [decode_run] + [lambda n=n: verify(n) for n in range(2, k_max + 2)]
    d = engine.draft
    if d is not None:
        d.clear()
        d.eval(filler[:CONTEXT_POS], outputs="none")
        drafter = ModelDrafter(d, DraftParams(max=RUN), main.n_vocab)
        history = filler[: CONTEXT_POS + 1]  # the draft model catches up on the pending token, then drafts

        def draft_run() -> None:
            drafter.draft(history, RUN, Sampling(temp=0.0), None)
            d.truncate(CONTEXT_POS)

        fns.append(draft_run)
    lookup = PromptLookupDrafter(DraftParams())
    text = filler * 5
    fns.append(lambda: lookup.draft(text + [text[-1]], 8, Sampling(temp=0.0), None))
    suffix = SuffixDrafter(DraftParams(), n_vocab=main.n_vocab)
    suffix.prepare(text)
    fns.append(lambda: suffix.draft(text + [text[-1]], k_max, Sampling(temp=0.0), None))
    return fns


def deep_positions(n_ctx: int) -> list[int]:
    """The depths a profile measures again at for this context size: DEEP_POS, each at most 3/4 of the context, none
    that leaves too little room to go well past CONTEXT_POS, and none less than half as deep again as the one
    before it (a short segment's slope would be the machine's noise, extrapolated)."""
    out: list[int] = []
    for p in sorted({min(p, n_ctx * 3 // 4) for p in DEEP_POS}):
        if p >= 4 * CONTEXT_POS and (not out or p >= 1.5 * out[-1]):
            out.append(p)
    return out


def _measure_deep(engine, filler: list[int], depths: list[int], reps: int, t1: float) -> dict:
    """Single decodes and passes over LONG_N tokens of the main model at each depth (ascending), the draft model's
    tokens that deep, and its prompt processing per token (filling its cache to the first depth in one call; in
    units of `t1`, the single decode at CONTEXT_POS), run as generation steps run them, both caches filled with
    `filler` repeated: the CostCurve fields they give (`deep`, `draft_prefill`; none without depths)."""
    from speclocal.engine.drafting.base import DraftParams
    from speclocal.engine.drafting.model import ModelDrafter
    from speclocal.engine.sampling import Sampling

    if not depths:
        return {}
    main, d = engine.main, engine.draft
    tokens = (filler * (max(depths) // len(filler) + 1))[: max(depths) + 1]
    probe = main.tokenize(" x = 1\n" * K_MAX, add_special=False)[: max(LONG_N)]
    out: dict = {}
    main.clear()
    if d is not None:
        d.clear()
        t0 = time.perf_counter()
        d.eval(tokens[: depths[0]], outputs="none")
        out["draft_prefill"] = (time.perf_counter() - t0) / depths[0] / t1
        drafter = ModelDrafter(d, DraftParams(max=RUN), main.n_vocab)
    measured = []
    for pos in depths:
        main.eval(tokens[len(main.tokens) : pos], outputs="none")

        def decode_run(pos: int = pos) -> None:
            for tok in probe[:RUN]:
                main.eval([tok], outputs="all").argmax(axis=1)
            main.truncate(pos)

        def verify(n: int, pos: int = pos) -> None:
            main.eval(probe[:n], outputs="all").argmax(axis=1)
            main.truncate(pos)

        fns = [decode_run] + [lambda n=n: verify(n) for n in LONG_N]
        if d is not None:
            d.eval(tokens[len(d.tokens) : pos], outputs="none")

            def draft_run(pos: int = pos) -> None:
                drafter.draft(tokens[: pos + 1], RUN, Sampling(temp=0.0), None)
                d.truncate(pos)

            fns.append(draft_run)
        for fn in fns:  # warm-up
            fn()
        times = _median_times(fns, reps)
        t_single = times[0] / RUN
        measured.append(Depth(pos, t_single, tuple((n, t / t_single) for n, t in zip(LONG_N, times[1:])),
                              times[-1] / times[0] if d is not None else None))
    out["deep"] = tuple(measured)
    return out


def load_or_measure(engine, refresh: bool = False, directory: Path | None = None,
                    max_age_s: float | None = None) -> tuple[CostCurve, bool]:
    """The cached curve for this engine's setup if younger than `max_age_s` (default STALE_DAYS) and deep enough
    (`cached_curve`), or a fresh measurement, saved unless a saved one still fresh reached deeper (a smaller
    context's refresh does not make the next larger one measure again). Returns (curve, cached)."""
    path = _profile_path(engine, directory)
    curve = None if refresh else cached_curve(engine, directory, max_age_s)
    if curve is not None:
        return curve, True
    curve = measure(engine)
    saved = cached_curve(engine, directory) if refresh else None
    if saved is None or _deepest(saved) <= _deepest(curve):
        try:
            atomic_write(path, json.dumps(curve.to_dict(), indent=1))
        except OSError as e:  # an unwritable cache costs a measurement next time, not this run
            log.warning("could not save the machine profile to %s: %s", path, e)
    return curve, False


def _deepest(curve: CostCurve) -> int:
    return max((d.pos for d in curve.deep), default=0)


def _profile_path(engine, directory: Path | None = None) -> Path:
    return (directory or locations.profiles_dir()) / f"{profile_key(engine)}.json"


def cached_curve(engine, directory: Path | None = None, max_age_s: float | None = None) -> CostCurve | None:
    """The saved curve for this engine's setup if younger than `max_age_s` (default STALE_DAYS) and measured as
    deep as this engine's context lets a profile measure (`deep_positions`), else None."""
    path = _profile_path(engine, directory)
    data = read_json(path)
    if data is None:
        return None
    try:
        curve = CostCurve.from_dict(data)
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        set_aside(path, f"not a profile: {e}")
        return None
    limit = STALE_DAYS * 86400 if max_age_s is None else max_age_s
    if time.time() - curve.meta.get("measured_at", 0) >= limit:
        return None
    wanted = deep_positions(engine.main.n_ctx)
    if wanted and _deepest(curve) < wanted[-1]:
        return None  # measured in a smaller context: past its deepest depth this one would only extrapolate
    return curve


_curves: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # engine -> its curve, for this process


def cost_curve(engine, refresh: bool = False, max_age_s: float | None = None) -> CostCurve:
    """This machine's cost curve for the engine's pair (cached on disk; see `speclocal profile`), kept for the
    engine's lifetime; `refresh` re-measures, `max_age_s` re-measures a cached curve older than that."""
    if engine not in _curves or refresh or max_age_s is not None:
        _curves[engine], _ = load_or_measure(engine, refresh=refresh, max_age_s=max_age_s)
    return _curves[engine]


def load_file(path: str | Path) -> CostCurve:
    """A saved profile (e.g. from another machine) for what-if predictions."""
    try:
        return CostCurve.from_dict(json.loads(Path(path).read_text()))
    except OSError as e:
        raise SpeclocalError(f"cannot read profile {path}: {e.strerror}") from None
    except (ValueError, KeyError, TypeError) as e:
        raise SpeclocalError(f"{path} is not a speclocal profile: {e}") from None
