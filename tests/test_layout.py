"""The weight layout: found by a test decode in a child process, the fallback said once and cached, flags obeyed.

`SPECLOCAL_PROBE_CRASH` makes the probe's child die by SIGSEGV in the layouts it names, so the fallback shows on
any machine (on a Xeon with AMX under KVM llama.cpp's default crashes by itself, with SIGILL)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from speclocal import locations
from speclocal.models import layout
from speclocal.models.devices import compute_label, devices

SPECLOCAL = [sys.executable, "-m", "speclocal.cli"]


@pytest.fixture(autouse=True)
def fresh_verdicts(tmp_path, monkeypatch) -> None:
    """No verdict from another test: each starts on a machine that has not been probed."""
    monkeypatch.setenv(locations.CACHE_ENV, str(tmp_path / "cache"))


@pytest.fixture
def compute() -> str:
    return compute_label(0, devices())


@pytest.fixture
def probes(monkeypatch) -> list[tuple[str, str]]:
    """Every probe run, as (model file, layout)."""
    calls: list[tuple[str, str]] = []
    real = layout.probe

    def counted(path, name, n_gpu_layers):
        calls.append((path.name, name))
        return real(path, name, n_gpu_layers)

    monkeypatch.setattr(layout, "probe", counted)
    return calls


def test_a_crashing_layout_is_skipped_said_once_and_cached(smollm2, compute, probes, monkeypatch):
    monkeypatch.setenv(layout.CRASH_ENV, "default")
    first = layout.choose([smollm2], compute, 0, None)
    assert first.layout == layout.candidates()[1] and first.news
    assert "llama.cpp's default weight layout" in first.note
    assert "crashed in a test decode (signal 11, SIGSEGV)" in first.note and "--repack forces" in first.note
    assert probes == [(smollm2.name, "default"), (smollm2.name, first.layout)]
    saved = json.loads(locations.layouts_path().read_text())[layout.machine_key(compute)]
    assert saved["default"]["ok"] is False and saved[first.layout]["ok"] is True
    assert "Q4_1" in saved[first.layout]["types"]

    again = layout.choose([smollm2], compute, 0, None)  # from the cache: no probe, nothing new to say
    assert (again.layout, again.news, len(probes)) == (first.layout, False, 2)
    assert layout.known([smollm2], compute) == first.layout

    monkeypatch.setattr(layout, "build_id", lambda: "another llama.cpp build")  # a new build checks again
    assert layout.known([smollm2], compute) is None
    rebuilt = layout.choose([smollm2], compute, 0, None)
    assert rebuilt.layout == first.layout and rebuilt.news and len(probes) == 4


def test_when_every_layout_crashes_the_stored_one_is_tried_and_said(smollm2, compute, monkeypatch):
    monkeypatch.setenv(layout.CRASH_ENV, "all")
    got = layout.choose([smollm2], compute, 0, None)
    assert got.layout == "stored" and got.news
    assert got.note.startswith("every weight layout failed a test decode on this machine")


def test_repack_flags_are_obeyed_without_a_probe(smollm2, compute, probes):
    assert layout.choose([smollm2], compute, 0, True).layout == "default"
    assert layout.choose([smollm2], compute, 0, False).layout == "stored"
    assert probes == []


def test_an_inconclusive_probe_decides_nothing(smollm2, compute, monkeypatch):
    """A probe killed from outside (SIGKILL: out of memory) or failing in Python is not the layout's doing."""
    monkeypatch.setattr(layout, "probe", lambda path, name, ngl: (False, "exit code 1: no memory", False))
    assert layout.choose([smollm2], compute, 0, None) == layout.Choice("default")
    assert not locations.layouts_path().exists()


def test_a_new_weight_type_is_probed_in_the_layout_already_chosen(smollm2, tiny_draft, compute, probes, monkeypatch):
    monkeypatch.setenv(layout.CRASH_ENV, "default")
    chosen = layout.choose([smollm2], compute, 0, None).layout
    assert layout.choose([smollm2, tiny_draft], compute, 0, None).layout == chosen
    assert probes[2:] == [(tiny_draft.name, chosen)]  # the crashed default is not tried again


def test_repack_patterns_name_only_the_matrices_cpu_repack_takes():
    matrices = (("token_embd.weight", "Q4_K", 151936), ("output.weight", "Q4_K", 151936),
                ("blk.0.attn_q.weight", "Q4_K", 1536), ("blk.1.attn_q.weight", "Q4_K", 1536),
                ("blk.0.ffn_down.weight", "Q6_K", 1536), ("blk.0.attn_k.weight", "Q4_0", 256),
                ("blk.0.attn_v.weight", "Q4_0", 250), ("blk.0.attn_norm.weight", "F32", 1))
    assert layout.repack_patterns(matrices) == [r"^blk\.(0|1)\.attn_q\.weight$", r"^blk\.(0)\.attn_k\.weight$",
                                                r"^output\.weight$"]


def _run(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(SPECLOCAL + args, capture_output=True, text=True, timeout=300)


def test_run_says_the_fallback_once_and_names_the_layout(smollm2, monkeypatch):
    monkeypatch.setenv(layout.CRASH_ENV, "default")
    args = ["run", "Count: 1, 2, 3,", "--raw", "--mode", "plain", "-m", str(smollm2), "-n", "4", "-c", "256", "--json"]
    first = _run(args)
    assert first.returncode == 0, first.stderr
    lines = first.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("speclocal: llama.cpp's default weight layout"), lines
    assert "(signal 11, SIGSEGV)" in lines[0] and f"using {layout.DESCRIPTIONS[layout.candidates()[1]]}" in lines[0]
    out = json.loads(first.stdout)
    assert out["layout"] == layout.candidates()[1] and out["compute"].endswith(layout.LABELS[out["layout"]])
    second = _run(args)
    assert second.returncode == 0 and second.stderr == "" and json.loads(second.stdout)["layout"] == out["layout"]
    forced = _run(args[:-1] + ["--no-repack", "--json"])
    assert json.loads(forced.stdout)["layout"] == "stored" and forced.stderr == ""
    shown = _run(["inspect", str(smollm2), "--json"])
    assert json.loads(shown.stdout)["layout"] == out["layout"]


def test_what_is_cached_per_machine_tells_cpus_sold_under_one_name_apart(monkeypatch):
    """Zen 3 and Zen 4 are both "AMD EPYC", and AVX-512 can come and go under one name: their layouts and cost
    profiles are not shared. A flag the hypervisor adds changes nothing; Arm's Features count as x86's flags do."""
    from speclocal.models import cpu
    from speclocal.policy.profile import machine_id

    x86 = "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: {}\nmodel name\t: AMD EPYC\n" \
          "stepping\t: 1\nflags\t\t: fpu avx2 fma{}\n"
    arm = "processor\t: 0\nCPU implementer\t: 0x41\nCPU part\t: 0xd0c\n\nHardware\t: board\nFeatures\t: fp asimd{}\n"
    texts = [x86.format(1, ""), x86.format(17, ""), x86.format(1, " avx512f"), x86.format(1, " hypervisor"),
             arm.format(""), arm.format(" sve")]
    keys = []
    try:
        for text in texts:
            monkeypatch.setattr(cpu, "_cpuinfo", lambda text=text: text)
            cpu.cpu_name.cache_clear(), cpu.cpu_id.cache_clear()
            keys.append((cpu.cpu_id(), layout.machine_key("CPU"), machine_id()))
    finally:
        cpu.cpu_name.cache_clear(), cpu.cpu_id.cache_clear()
    zen3, zen4, avx512, hypervisor, neon, sve = keys
    assert zen3[0].startswith("AMD EPYC | AuthenticAMD family 25 model 1 stepping 1 | ")
    assert neon[0].startswith("board | Arm implementer 0x41 part 0xd0c ")
    for other in (zen4, avx512, sve):
        assert all(a != b for a, b in zip(zen3 if other is not sve else neon, other))
    assert hypervisor == zen3
