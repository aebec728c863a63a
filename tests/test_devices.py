"""Built for the machine the user has: -ngl follows what the build can offload, and the memory guard checks
the pool that holds the weights (device facts injected; no GPU needed)."""

from __future__ import annotations

import pytest

from speclocal import options
from speclocal.errors import SpeclocalError
from speclocal.models.devices import ALL_LAYERS, Device, compute_label, memory_pools, resolve_gpu_layers

GiB = 2**30
CPU = Device("CPU", "AMD EPYC", "cpu", 20 * GiB, 24 * GiB)
PAIR = [(int(1.0 * GiB), int(0.2 * GiB), int(0.3 * GiB), 28), (int(0.5 * GiB), int(0.1 * GiB), int(0.3 * GiB), 24)]


def test_gpu_layers_default_to_all_where_the_build_can_offload_and_to_none_where_not(monkeypatch):
    import llama_cpp

    assert options.default("n_gpu_layers") == "auto"
    assert resolve_gpu_layers("auto", offload_supported=True) == ALL_LAYERS
    assert resolve_gpu_layers("auto", offload_supported=False) == 0
    for supported, want in ((True, ALL_LAYERS), (False, 0)):  # what the build says, asked through the binding
        monkeypatch.setattr(llama_cpp, "llama_supports_gpu_offload", lambda s=supported: s)
        assert resolve_gpu_layers("auto") == want
    assert resolve_gpu_layers("0") == 0 and resolve_gpu_layers("all") == ALL_LAYERS and resolve_gpu_layers(20) == 20
    with pytest.raises(SpeclocalError, match="'auto' or 'all'"):
        resolve_gpu_layers("many")
    assert options.BY_NAME["n_gpu_layers"].problem("-3") is not None and options.BY_NAME["n_gpu_layers"].problem("all") is None


@pytest.mark.parametrize("case, found, ngl, want", [
    ("cpu only", (CPU,), ALL_LAYERS, [("system RAM", True)]),
    ("forced to the cpu", (CPU, Device("CUDA0", "NVIDIA H200", "gpu", 100 * GiB, 140 * GiB)), 0,
     [("system RAM", True)]),
    ("discrete gpu, room", (CPU, Device("CUDA0", "NVIDIA RTX 4090", "gpu", 20 * GiB, 24 * GiB)), ALL_LAYERS,
     [("CUDA0 (NVIDIA RTX 4090)'s free memory", True), ("system RAM", True)]),
    ("discrete gpu, full", (CPU, Device("CUDA0", "NVIDIA T400", "gpu", 1 * GiB, 2 * GiB)), ALL_LAYERS,
     [("CUDA0 (NVIDIA T400)'s free memory", False), ("system RAM", True)]),
    ("apple silicon", (CPU, Device("Metal", "Apple M3 Pro", "igpu", 1 * GiB, 26 * GiB)), ALL_LAYERS,
     [("Metal's recommended working set", False), ("system RAM", True)]),
    ("the backend does not say", (CPU, Device("Vulkan0", "AMD Radeon 8060S", "gpu", 0, 0)), ALL_LAYERS,
     [("Vulkan0 (AMD Radeon 8060S)'s free memory", True), ("system RAM", True)]),
])
def test_the_memory_guard_checks_the_pool_that_holds_the_weights(case, found, ngl, want):
    pools = memory_pools(PAIR, 20 * GiB, ngl, found)
    assert [(p.pool, p.fits) for p in pools] == want, case
    total = sum(w + kv + c for w, kv, c, _ in PAIR)
    if len(pools) == 2 and found[1].kind == "gpu":  # all layers and the buffers on the GPU, nothing left on the CPU
        assert pools[0].need == total and pools[1].need == 0
    if case == "the backend does not say":
        assert pools[0].available is None and "does not say" in pools[0].note
    half = memory_pools(PAIR, 20 * GiB, 14, found)  # 14 of 28 and 14 of 24 layers: about half on each side
    if found[-1].kind == "gpu" and case != "forced to the cpu":
        assert 0 < half[1].need < total and half[0].need + half[1].need == pytest.approx(total, rel=0.01)


SMALL_GPU = (CPU, Device("CUDA0", "NVIDIA T400", "gpu", 1 * GiB, 2 * GiB))


def test_the_refusal_names_the_pool_it_checked(tiny_main, tiny_draft, monkeypatch):
    from speclocal.models import plan

    monkeypatch.setattr(plan, "devices", lambda: SMALL_GPU)
    with pytest.raises(SpeclocalError, match=r"of CUDA0 \(NVIDIA T400\)'s free memory .* lower -ngl"):
        plan.check_load(tiny_main, tiny_draft, 4096, ALL_LAYERS).require()
    plan.check_load(tiny_main, tiny_draft, 4096, 0).require()  # -ngl 0: the CPU's RAM, which has room
    assert compute_label(ALL_LAYERS, SMALL_GPU) == "CUDA0 (NVIDIA T400), all layers"
    assert compute_label(0, SMALL_GPU) == "CPU (AMD EPYC)"


def test_the_tui_and_the_engine_agree_where_the_gpu_is_too_small(tiny_main, tiny_draft, monkeypatch):
    """One verdict (`check_load`): with every layer on a GPU too small for the pair, the engine refuses and the TUI
    shows why instead of loading; with -ngl 0 the TUI loads, and the engine's check lets it."""
    import asyncio
    import time

    from speclocal.engine import Engine
    from speclocal.models import plan
    from speclocal.options import Settings
    from speclocal.tui.app import SpeclocalApp
    from speclocal.tui.screens import ChoiceScreen
    from speclocal.tui.testing import FakeBackend

    monkeypatch.setattr(plan, "devices", lambda: SMALL_GPU)

    def tui(ngl: str) -> str:
        """What the TUI does with the pair: "loaded", or the text of the screen it shows instead."""
        loaded: list = []
        settings = Settings(main=str(tiny_main), draft=str(tiny_draft), ctx_size=4096, n_gpu_layers=ngl)

        async def go() -> str:
            app = SpeclocalApp(settings, backend_factory=lambda spec: loaded.append(spec) or FakeBackend())
            async with app.run_test(size=(100, 30)) as pilot:
                deadline = time.monotonic() + 60
                while not (loaded or isinstance(app.screen, ChoiceScreen) and app.screen.query("#choice-text")):
                    assert time.monotonic() < deadline, "neither loaded nor a verdict in time"
                    await pilot.pause(0.05)
                return "loaded" if loaded else str(app.screen.query_one("#choice-text").render())

        return asyncio.run(go())

    with pytest.raises(SpeclocalError, match=r"not enough memory: .* of CUDA0 \(NVIDIA T400\)'s free memory"):
        Engine(tiny_main, tiny_draft, n_ctx=4096, n_gpu_layers="all")
    verdict = tui("all")
    assert "CUDA0 (NVIDIA T400)'s free memory" in verdict and "does not fit" in verdict
    plan.check_load(tiny_main, tiny_draft, 4096, "0").require()  # what Engine(..., n_gpu_layers="0") checks
    assert tui("0") == "loaded"


def test_each_layout_reaches_llama_cpp_and_the_engine_names_the_one_that_ran(gemma3, caplog):
    """Every weight layout that survives a test decode here reaches llama.cpp as meant (stored: no re-laid-out
    buffer; repacked without AMX: a CPU_REPACK buffer and no AMX one), --repack/--no-repack parse as given and
    neither means "probe"; the engine names its layout in its compute label (which keys the cost profile: the
    layouts' curves differ) and generates."""
    import argparse
    import logging

    import llama_cpp

    from speclocal.engine import Engine, GenerationRequest
    from speclocal.engine.llama import LoadedModel
    from speclocal.models import layout
    from speclocal.models.devices import compute_label, devices
    from speclocal.policy.profile import profile_key

    parser = argparse.ArgumentParser()
    options.add_options(parser, "models")
    assert options.settings_from_args(parser.parse_args([])).repack is None
    assert options.settings_from_args(parser.parse_args(["--repack"])).repack is True
    assert options.settings_from_args(parser.parse_args(["--no-repack"])).repack is False
    caplog.set_level(logging.DEBUG, logger="speclocal.llama_cpp")
    repack_built = b"REPACK = 1" in llama_cpp.llama_print_system_info()
    device = compute_label(0, devices())
    usable = [name for name in layout.candidates() if layout.survives(name, [gemma3], device, 0)[0] is not False]
    assert "stored" in usable
    for name in usable:
        caplog.clear()
        LoadedModel(gemma3, 256, 2, layout=name).close()
        repacked = "CPU_REPACK model buffer" in caplog.text
        amx = "AMX model buffer" in caplog.text
        if name == "stored":
            assert not repacked and not amx, caplog.text[-2000:]
        elif name == "no-amx":
            assert repacked and not amx, caplog.text[-2000:]
        else:
            assert (repacked or amx) == repack_built, caplog.text[-2000:]
    chosen = layout.choose([gemma3], device, 0, None).layout
    engines = {r: Engine(gemma3, n_ctx=256, n_gpu_layers=0, repack=r) for r in (None, False)}
    try:
        assert engines[None].layout.layout == chosen and engines[False].layout.layout == "stored"
        assert engines[None].compute == device + layout.LABELS[chosen]
        assert engines[False].compute == device + ", weights not repacked"
        assert (profile_key(engines[False]) == profile_key(engines[None])) == (chosen == "stored")
        for e in engines.values():
            res = e.generate(GenerationRequest(prompt="def add(a, b):", mode="plain", n_predict=8))
            assert res.n_generated == 8
    finally:
        for e in engines.values():
            e.close()
