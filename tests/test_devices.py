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
    shows why instead of loading; with -ngl 0 the TUI loads, and the engine's check lets it; `--force` loads as the
    engine's --force does."""
    import asyncio
    import time

    from speclocal.engine import Engine
    from speclocal.models import plan
    from speclocal.options import Settings
    from speclocal.tui.app import SpeclocalApp
    from speclocal.tui.screens import ChoiceScreen
    from speclocal.tui.testing import FakeBackend

    monkeypatch.setattr(plan, "devices", lambda: SMALL_GPU)  # what the TUI's check reads
    monkeypatch.setattr("speclocal.engine.generate.devices", lambda: SMALL_GPU)  # the engine reads them once

    loaded: list = []

    def tui(ngl: str, force: bool = False) -> str:
        """What the TUI does with the pair: "loaded", or the text of the screen it shows instead."""
        loaded.clear()
        settings = Settings(main=str(tiny_main), draft=str(tiny_draft), ctx_size=4096, n_gpu_layers=ngl, force=force)

        async def go() -> str:
            app = SpeclocalApp(settings, backend_factory=lambda spec: loaded.append(spec) or FakeBackend())
            async with app.run_test(size=(100, 30)) as pilot:
                deadline = time.monotonic() + 300  # a hang, not a slow machine: the check imports llama.cpp
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
    assert tui("all", force=True) == "loaded" and loaded[0].settings.force


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


class FakeGgml:
    """ggml's and ggml-base's device calls as llama.cpp's libraries answer them through ctypes, for the devices
    listed: (name, description, ggml_backend_dev_type, free, total). `free` may be changed between checks."""

    def __init__(self, listed):
        self.listed = [list(d) for d in listed]
        self.calls = {"count": 0, "memory": 0}

    def ggml_backend_dev_count(self):
        self.calls["count"] += 1
        return len(self.listed)

    def ggml_backend_dev_get(self, i):
        return i + 1  # a handle: never 0

    def ggml_backend_dev_name(self, dev):
        return self.listed[dev - 1][0].encode()

    def ggml_backend_dev_description(self, dev):
        return self.listed[dev - 1][1].encode()

    def ggml_backend_dev_type(self, dev):
        return self.listed[dev - 1][2]

    def ggml_backend_dev_memory(self, dev, free, total):  # free, total: ctypes.byref(c_size_t)
        self.calls["memory"] += 1
        free._obj.value, total._obj.value = self.listed[dev - 1][3], self.listed[dev - 1][4]


def _lib(fake: FakeGgml):
    """An object with the fake's calls as plain functions, which take restype/argtypes as a CDLL's do."""
    import types

    lib = types.SimpleNamespace()
    for name in dir(fake):
        if name.startswith("ggml_"):
            bound = getattr(fake, name)
            setattr(lib, name, lambda *a, _f=bound: _f(*a))
    return lib


@pytest.fixture
def fake_ggml(monkeypatch):
    """Install a FakeGgml at the ctypes boundary (where `_library` opens ggml's libraries) on a given machine."""
    from speclocal.models import devices as dev_mod

    def install(listed, platform_name="linux", machine="x86_64") -> FakeGgml:
        fake = FakeGgml(listed)
        lib = _lib(fake)
        monkeypatch.setattr(dev_mod, "_library", lambda name: lib)
        monkeypatch.setattr(dev_mod.sys, "platform", platform_name)
        monkeypatch.setattr(dev_mod.platform, "machine", lambda: machine)
        dev_mod._registry.cache_clear()
        return fake

    yield install
    dev_mod._registry.cache_clear()


GPU, IGPU = 1, 2  # ggml_backend_dev_type
CPU_DEV = ("CPU", "AMD Ryzen AI MAX+ 395", 0, 100 * GiB, 128 * GiB)
TOTAL = sum(w + kv + c for w, kv, c, _ in PAIR)


@pytest.mark.parametrize("case, machine, listed, kind, label, want", [
    ("metal on apple silicon", ("darwin", "arm64"),
     [("Metal", "Apple M3 Max", GPU, 40 * GiB, 48 * GiB), ("CPU", "Apple M3 Max", 0, 0, 0)], "igpu",
     "Metal (Apple M3 Max), all layers", [("Metal's recommended working set", True), ("system RAM", True)]),
    ("newer ggml's MTL0, working set full", ("darwin", "arm64"),
     [("MTL0", "Apple M1", GPU, 1 * GiB, 5 * GiB), ("CPU", "Apple M1", 0, 0, 0)], "igpu",
     "MTL0 (Apple M1), all layers", [("Metal's recommended working set", False), ("system RAM", True)]),
    ("metal on an intel mac: a discrete gpu", ("darwin", "x86_64"),
     [("Metal", "AMD Radeon Pro 5500M", GPU, 8 * GiB, 8 * GiB), ("CPU", "Intel Core i9", 0, 0, 0)], "gpu",
     "Metal (AMD Radeon Pro 5500M), all layers",
     [("Metal (AMD Radeon Pro 5500M)'s free memory", True), ("system RAM", True)]),
    ("cuda gpu", ("linux", "x86_64"),
     [CPU_DEV, ("CUDA0", "NVIDIA GeForce RTX 4090", GPU, 20 * GiB, 24 * GiB)], "gpu",
     "CUDA0 (NVIDIA GeForce RTX 4090), all layers",
     [("CUDA0 (NVIDIA GeForce RTX 4090)'s free memory", True), ("system RAM", True)]),
    ("amd apu that ggml calls a gpu", ("linux", "x86_64"),
     [CPU_DEV, ("Vulkan0", "AMD Radeon 8060S Graphics", GPU, 90 * GiB, 96 * GiB)], "igpu",
     "Vulkan0 (AMD Radeon 8060S Graphics), all layers",
     [("Vulkan0 (AMD Radeon 8060S Graphics)'s memory (shared with the CPU)", True), ("system RAM", True)]),
    ("amd apu that ggml calls an igpu", ("linux", "x86_64"),
     [CPU_DEV, ("ROCm0", "AMD Radeon Graphics", IGPU, 1 * GiB, 2 * GiB)], "igpu",
     "ROCm0 (AMD Radeon Graphics), all layers",
     [("ROCm0 (AMD Radeon Graphics)'s memory (shared with the CPU)", False), ("system RAM", True)]),
    ("cpu only", ("linux", "x86_64"), [CPU_DEV], "cpu", "CPU (AMD Ryzen AI MAX+ 395)", [("system RAM", True)]),
])
def test_each_machine_gets_its_pools_labels_and_verdict(fake_ggml, case, machine, listed, kind, label, want):
    from speclocal.models.devices import devices, offload_device

    fake_ggml(listed, *machine)
    found = devices()
    assert [d.name for d in found] == [d[0] for d in listed], case
    target = offload_device(found)
    assert (target.kind if target else "cpu") == kind, case
    assert compute_label(ALL_LAYERS, found) == label, case
    pools = memory_pools(PAIR, 20 * GiB, ALL_LAYERS, found)
    assert [(p.pool, p.fits) for p in pools] == want, case
    if kind == "igpu":  # one memory: the GPU's share of it, and all of it counted once against the RAM
        assert pools[0].need == TOTAL and pools[1].need == TOTAL and pools[0].available == target.free
    elif kind == "gpu":  # every layer on its own memory: nothing left for the RAM but what runs on the CPU
        assert pools[0].need == TOTAL and pools[1].need == 0
    ram_short = memory_pools(PAIR, 1 * GiB, ALL_LAYERS, found)[-1]  # unified memory or the CPU: the RAM decides too
    assert ram_short.fits == (kind == "gpu"), case


def test_a_second_check_sees_the_free_memory_of_the_moment(fake_ggml, tiny_main, tiny_draft):
    """Which devices exist is read once a process; their free memory at each check: a long-running serve or TUI
    checks a newly chosen pair against what is free now, not what was free at start-up."""
    from speclocal.models import plan

    fake = fake_ggml([CPU_DEV, ("CUDA0", "NVIDIA GeForce RTX 4090", GPU, 20 * GiB, 24 * GiB)])
    first = plan.check_load(tiny_main, tiny_draft, 4096, ALL_LAYERS)
    assert first.fits and first.pools[0].available == 20 * GiB
    fake.listed[1][3] = 100 * 2**20  # another program took the GPU's memory
    second = plan.check_load(tiny_main, tiny_draft, 4096, ALL_LAYERS)
    assert not second.fits and second.pools[0].available == 100 * 2**20
    with pytest.raises(SpeclocalError, match=r"of CUDA0 \(NVIDIA GeForce RTX 4090\)'s free memory"):
        second.require()
    fake.listed[1][3] = 20 * GiB  # and gave it back
    assert plan.check_load(tiny_main, tiny_draft, 4096, ALL_LAYERS).fits
    assert fake.calls["count"] == 1  # the device list: read once
    assert fake.calls["memory"] == 2 + 3 * 2  # the memory: once per device at each check (and at the first read)


MiB = 2**20
# llama.cpp's own lines for each buffer it allocates, as each kind of machine prints them (llama-model.cpp
# "%12s model buffer size", llama-kv-cache.cpp "%10s KV buffer size", llama-context.cpp output and compute)
CUDA_LOG = ["load_tensors: offloaded 29/29 layers to GPU",
            "load_tensors:        CUDA0 model buffer size =   934.28 MiB",
            "load_tensors:   CPU_Mapped model buffer size =   166.92 MiB",
            "llama_kv_cache:      CUDA0 KV buffer size =    28.00 MiB",
            "llama_context:  CUDA_Host  output buffer size =     0.58 MiB",
            "llama_context:      CUDA0 compute buffer size =   299.75 MiB",
            "llama_context:  CUDA_Host compute buffer size =    11.01 MiB"]
METAL_LOG = ["load_tensors:  MTL0_Mapped model buffer size =   934.28 MiB",
             "load_tensors:   CPU_Mapped model buffer size =   166.92 MiB",
             "llama_kv_cache:       MTL0 KV buffer size =    28.00 MiB",
             "llama_context:        CPU  output buffer size =     0.58 MiB",
             "llama_context:       MTL0 compute buffer size =   299.75 MiB",
             "llama_context:        CPU compute buffer size =    11.01 MiB"]
CPU_LOG = ["load_tensors:   CPU_Mapped model buffer size =  1059.54 MiB",
           "load_tensors:          AMX model buffer size =   700.12 MiB",
           "load_tensors:   CPU_REPACK model buffer size =    41.50 MiB",
           "llama_kv_cache:        CPU KV buffer size =    28.00 MiB",
           "llama_context:        CPU  output buffer size =     0.58 MiB",
           "llama_context:        CPU compute buffer size =   299.75 MiB"]


@pytest.mark.parametrize("case, machine, listed, log, want", [
    ("cuda gpu", ("linux", "x86_64"), [CPU_DEV, ("CUDA0", "NVIDIA H200", GPU, 100 * GiB, 140 * GiB)], CUDA_LOG,
     {"CUDA0": (934.28, 28.0, 299.75, 0.0), "host": (166.92, 0.0, 11.01, 0.58)}),
    ("metal on apple silicon", ("darwin", "arm64"), [("MTL0", "Apple M3 Max", GPU, 40 * GiB, 48 * GiB),
                                                     ("CPU", "Apple M3 Max", 0, 0, 0)], METAL_LOG,
     {"MTL0": (934.28, 28.0, 299.75, 0.0), "host": (166.92, 0.0, 11.01, 0.58)}),
    ("cpu only, weights repacked for AMX", ("linux", "x86_64"), [CPU_DEV], CPU_LOG,
     {"host": (1059.54 + 700.12 + 41.5, 28.0, 299.75, 0.58)}),
    ("a gpu listed, a cpu-only build", ("linux", "x86_64"), [CPU_DEV, ("CUDA0", "NVIDIA H200", GPU, 100 * GiB, 140 * GiB)],
     CPU_LOG, {"host": (1059.54 + 700.12 + 41.5, 28.0, 299.75, 0.58)}),
])
def test_each_buffer_is_counted_on_the_device_that_holds_it(fake_ggml, case, machine, listed, log, want):
    """llama.cpp's buffer sizes, per device: a GPU's own buffers on it; mapped, repacked and pinned host buffers on
    the host; nothing on a GPU the build does not use."""
    from speclocal.engine.llama import HELD, held_per_device, placed
    from speclocal.models.devices import devices

    fake_ggml(listed, *machine)
    held = held_per_device(placed(log, devices()), 0)
    assert {k: tuple(v[h] for h in HELD) for k, v in held.items()} == {
        k: tuple(round(x * MiB) for x in v) for k, v in want.items()}, case
    # a decode that asked for more logits rows than the buffer held: the host's output buffer grew to them
    grown = held_per_device(placed(log, devices()), 4 * 151936 * 9)
    assert grown["host"]["output"] == 4 * 151936 * 9 and grown["host"]["weights"] == held["host"]["weights"]


def test_what_each_model_holds_is_all_on_the_host_on_a_cpu(tiny_main, tiny_draft, fake_ggml):
    """Real models on this CPU, a CUDA GPU listed at the ctypes boundary and -ngl 0: every buffer llama.cpp
    allocated is on the host; its weights are the GGUF's tensors (plus repacked copies), its KV cache the one
    the engine computes, its output buffer grown to the verify's k+1 rows."""
    from speclocal.engine import Engine, GenerationRequest
    from speclocal.engine.drafting.base import DraftParams
    from speclocal.models.gguf_info import read_gguf

    fake_ggml([CPU_DEV, ("CUDA0", "NVIDIA H200", GPU, 100 * GiB, 140 * GiB)])
    engine = Engine(tiny_main, tiny_draft, n_ctx=512, n_gpu_layers=0)
    try:
        res = engine.generate(GenerationRequest(prompt="def add(a, b):", mode="spec", n_predict=8,
                                                draft=DraftParams(max=3)))
    finally:
        engine.close()
    mem = res.memory
    assert list(mem.main_held) == ["host"] and list(mem.draft_held) == ["host"]
    for held, path, kv in ((mem.main_held["host"], tiny_main, mem.main_kv), (mem.draft_held["host"], tiny_draft,
                                                                              mem.draft_kv)):
        tensors = read_gguf(path).tensor_bytes
        assert tensors * 0.99 <= held["weights"] <= tensors * 2.01  # mapped file, plus at most a repacked copy
        assert held["kv"] == pytest.approx(kv, abs=0.01 * MiB)
        assert held["compute"] > 0
    n_vocab = 151936
    assert mem.main_held["host"]["output"] >= 4 * n_vocab * 4  # verify: k + 1 = 4 rows of logits
    main, draft = mem.per_device()["host"]
    assert main == sum(mem.main_held["host"].values()) and draft == sum(mem.draft_held["host"].values())
