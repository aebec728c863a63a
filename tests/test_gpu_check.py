"""scripts/gpu_check.py end to end on this CPU (tiny shapes, the installed llama-cpp-python, no build), its
time-boxing, and the bundle builder's stripping and size check (no download: a fake sdist tree)."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "gpu_check.py"
needs_llama = pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None,
                                 reason="needs llama-cpp-python (llama.cpp) installed")


def _check(tmp_path: Path, *extra: str, timeout: float = 180) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / "out"
    cmd = [sys.executable, str(SCRIPT), "--shapes", "tiny", "--skip-build", "--vocab", "synthetic",
           "--work", str(tmp_path / "work"), "--out", str(out), *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO)
    assert (out / "gpu_check.json").is_file(), proc.stdout + proc.stderr
    return proc, json.loads((out / "gpu_check.json").read_text())


@pytest.fixture(scope="module")
def tiny_check(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gpu_check")
    proc, data = _check(tmp)
    return tmp, proc, data


@needs_llama
@pytest.mark.models
def test_tiny_check_runs_every_phase(tiny_check):
    tmp, proc, r = tiny_check
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert r["status"] == "ok" and not r["incomplete_phases"]
    ph = {n: p["status"] for n, p in r["phases"].items()}
    assert ph.pop("build") == "skipped" and ph.pop("install") == "skipped"  # --skip-build, no --bundle
    assert set(ph.values()) == {"ok"}, ph
    # the most valuable numbers first (one chance on a GPU): profiles, the runs, predicted vs measured, then the sweep
    assert list(ph) == ["environment", "inspect", "models", "profile", "profile_self", "run:draft-k3", "run:self-k3",
                        "run:draft-k8", "run:self-k8", "run:self-k8-host", "predict", "synthetic"], list(ph)
    cells = r["synthetic"]["rows"]  # synthetic acceptance 0.5/0.8/0.9 at k = 3/8, each against the cost model
    assert sorted((c["k"], c["rate"]) for c in cells) == [(k, a) for k in (3, 8) for a in (0.5, 0.8, 0.9)]
    assert all(c["measured"] > 0 and c["predicted"] > 0 for c in cells)
    assert all(c["tokens"] == 48 for c in cells), cells  # greedy outputs never parted: every cell measured all of -n
    assert all(p["seconds"] >= 0 for p in r["phases"].values() if "seconds" in p)
    assert "[" in proc.stdout and "s] models:" in proc.stdout  # progress with elapsed times
    md = (tmp / "out" / "gpu_check.md").read_text()
    assert "| self-k3 | self | 3 |" in md and "Synthetic acceptance" in md
    host = r["runs"]["self-k8-host"]  # on a CPU -ngl auto samples on the host too: the same run, the same tokens
    assert host["flags"] == ["--no-backend-sampling"] and "sampling on the device" not in host["compute"]
    assert host["spec"]["tokens_sha1"] == r["runs"]["self-k8"]["spec"]["tokens_sha1"]
    assert "Sampling on the device (self-k8" in md and "the same tokens: True" in md
    assert "| models | ok |" in md and "expected on 16 cores" in md


@needs_llama
@pytest.mark.models
def test_tiny_check_backend_and_models(tiny_check):
    _, _, r = tiny_check
    llama = r["llama"]
    assert llama["llama_cpp_version"] and llama["system_info"]
    assert llama["devices"] and all(d["name"] for d in llama["devices"])
    if not llama["gpu_devices"]:
        assert llama["backend"] == "CPU" and r["n_gpu_layers"] == 0
    assert r["ngl"] == "auto"  # what users get
    m = r["models"]
    assert m["vocab"]["n_vocab"] > 256
    for role in ("main", "draft"):
        x = m["models"][role]
        assert x["check"]["finite"] and x["check"]["greedy_eog_positions"] == 0
        # conditioned weights (INIT_STD): a clear greedy winner at every position, so verify passes and single-token
        # decoding agree (one scale everywhere: median top-2 margin 0.03 here, near ties that flip full shapes' runs)
        assert x["check"]["top2_margin_median"] > 2, x["check"]
        assert 0 < x["quant_bytes"] < x["f16_bytes"]
        quantized = set(x["tensor_types_mib"]) - {"F32", "F16"}
        assert quantized, x["tensor_types_mib"]  # Q4_K_M (or its fallbacks for small rows) really ran
    assert m["models"]["main"]["n_params"] > m["models"]["draft"]["n_params"]


@needs_llama
@pytest.mark.models
def test_tiny_check_profile_runs_and_predictions(tiny_check):
    _, _, r = tiny_check
    for key in ("profile", "profile_self"):
        c = r[key]["curve"]
        assert c["verify"][0] == pytest.approx(1.0) and len(c["verify"]) == 17
        assert all(math.isfinite(v) and v > 0 for v in c["verify"])
        assert c["t_single"] > 0 and 0 < c["draft_cost"] < 50
    assert r["profile_self"]["curve"]["meta"]["draft"] == r["profile_self"]["curve"]["meta"]["main"]
    for name, x in r["runs"].items():
        spec, plain = x["spec"], x["plain"]
        assert plain["decode_tps"] > 0 and spec["decode_tps"] > 0
        # the special tokens' zeroed output rows: no random EOS, every run generates all -n tokens
        assert plain["n_generated"] == spec["n_generated"] == x["n_predict"], name
        assert plain["stop_reason"] == spec["stop_reason"] == "length"
        assert x["measured_speedup"] == pytest.approx(spec["decode_tps"] / plain["decode_tps"])
        p = x["prediction"]
        if x["flags"]:  # self-k8-host: the profiles were measured without --no-backend-sampling
            assert p["predicted_speedup"] is None and "--no-backend-sampling" in p["reason"]
            continue
        assert 0.01 < p["predicted_speedup"] < 100 and math.isfinite(p["error"])
        if x["draft"] == "self":  # the main model drafting for itself, greedy: (nearly) everything accepted
            assert spec["acceptance"] >= 0.95 and p["acceptance_iid"] >= 0.95, (name, spec["acceptance"])
            assert p["c"] == pytest.approx(r["profile_self"]["curve"]["draft_cost"])
    assert r["prediction_summary"]["runs"] == 4


def test_time_budget_leaves_partial_json(tmp_path):
    """A budget too short for the phases: each is skipped and says why, the JSON and summary still appear."""
    proc, r = _check(tmp_path, "--time-budget", "2", timeout=60)
    assert proc.returncode == 1
    assert r["status"] == "partial"
    assert r["phases"]["environment"]["status"] == "ok"
    assert r["phases"]["inspect"]["status"] == "skipped" and "time budget" in r["phases"]["inspect"]["reason"]
    assert r["phases"]["models"]["reason"] == "needs inspect"
    assert "models" in r["incomplete_phases"]
    assert (tmp_path / "out" / "gpu_check.md").read_text().startswith("# speclocal GPU check: partial")


def test_model_plan_matches_the_real_qwen_ggufs(load_script):
    """Tensor names, shapes and counts of the full shapes as in the default pair's GGUF files (read from
    qwen2.5-coder-1.5b/0.5b-instruct-q4_k_m.gguf: 339 and 291 tensors, untied output.weight)."""
    g = load_script("gpu_check")
    main = g._tensor_plan(g.SHAPES["full"]["main"], 151936, tied=False)
    draft = g._tensor_plan(g.SHAPES["full"]["draft"], 151936, tied=False)
    assert len(main) == 339 and len(draft) == 291
    shapes = {n: s for n, s, _ in main}
    assert shapes["output.weight"] == (151936, 1536) and shapes["blk.0.attn_k.weight"] == (256, 1536)
    assert shapes["blk.27.ffn_down.weight"] == (1536, 8960) and shapes["blk.0.attn_q.bias"] == (1536,)
    assert sum(math.prod(s) for _, s, _ in main) == 1_777_088_000
    assert sum(math.prod(s) for _, s, _ in draft) == 630_167_424
    assert len(g._tensor_plan(g.SHAPES["full"]["main"], 151936, tied=True)) == 338


def test_acceptance_estimate_and_drafts(load_script):
    g = load_script("gpu_check")
    assert g.run_drafts(10, 5, 3) == [3, 3, 3, 1, 0]
    assert g.iid_acceptance(7, []) is None and g.iid_acceptance(0, [3]) == 0.0 and g.iid_acceptance(9, [3, 3, 3]) == 1.0
    a = g.iid_acceptance(50, [3] * 40)  # E[accepted] per step a + a^2 + a^3 = 1.25 -> a ~ 0.588
    assert a + a * a + a ** 3 == pytest.approx(50 / 40, rel=1e-6)


def test_read_tokenizer_copies_every_array_in_full(load_script, tiny_draft):
    """The vocabulary a model is written with: tokens, token types and all merges, with their GGUF types."""
    import gguf

    from speclocal.models.gguf_info import read_gguf

    tok = load_script("gpu_check").read_tokenizer(tiny_draft)
    tokens, vtype, sub = tok["tokenizer.ggml.tokens"]
    assert (vtype, sub) == (gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.STRING)
    assert tokens == [t.decode() for t in read_gguf(tiny_draft).tokens] and "<|im_end|>" in tokens
    assert len(tok["tokenizer.ggml.token_type"][0]) == len(tokens)
    assert len(tok["tokenizer.ggml.merges"][0]) > 100_000  # longer than the arrays read_gguf keeps
    assert all(k.startswith("tokenizer.") for k in tok)


def _fake_sdist(root: Path) -> Path:
    """The layout of the llama-cpp-python sdist, one small file per place."""
    top = root / "llama_cpp_python-0.3.36"
    v = "vendor/llama.cpp/"
    files = [
        "pyproject.toml", "CMakeLists.txt", "PKG-INFO", "README.md", "LICENSE.md", "CHANGELOG.md", "Makefile",
        "llama_cpp/__init__.py", "llama_cpp/llama_cpp.py", "llama_cpp/server/app.py", "docs/index.md",
        "examples/high_level_api/x.py", "tests/test_llama.py", "docker/Dockerfile",
        v + "CMakeLists.txt", v + "cmake/common.cmake", v + "include/llama.h", v + "src/llama.cpp",
        v + "common/CMakeLists.txt", v + "vendor/CMakeLists.txt", v + "vendor/miniaudio/miniaudio.h",
        v + "ggml/CMakeLists.txt", v + "ggml/src/ggml-cpu/CMakeLists.txt", v + "ggml/src/ggml-cuda/CMakeLists.txt",
        v + "ggml/src/ggml-cuda/template-instances/mmq-instance-q4_k.cu", v + "ggml/src/ggml-vulkan/x.cpp",
        v + "ggml/src/ggml-metal/x.m", v + "ggml/src/ggml-hip/CMakeLists.txt", v + "ggml/src/ggml-rpc/x.cpp",
        v + "ggml/src/ggml-blas/x.cpp", v + "models/ggml-vocab-qwen2.gguf", v + "models/ggml-vocab-llama-bpe.gguf",
        v + "models/templates/x.jinja", v + "tools/mtmd/CMakeLists.txt", v + "tools/mtmd/mtmd.cpp",
        v + "tools/mtmd/test-1.jpeg", v + "tools/mtmd/tests/t.sh", v + "tools/server/server.cpp",
        v + "tools/CMakeLists.txt", v + "docs/build.md", v + "tests/test-x.cpp", v + "examples/x/x.cpp",
        v + "gguf-py/gguf/x.py", v + "convert_hf_to_gguf.py", v + "media/logo.png", v + ".git",
        ".git/modules/vendor/llama.cpp/objects/pack/pack-1.pack", ".git/modules/vendor/llama.cpp/HEAD",
    ]
    for f in files:
        (top / f).parent.mkdir(parents=True, exist_ok=True)
        (top / f).write_text("x" * 100)
    return top


def test_strip_keeps_what_the_build_needs(load_script, tmp_path):
    b = load_script("build_gpu_bundle")
    top = _fake_sdist(tmp_path)
    stats = b.strip_sdist(top)
    left = sorted(p.relative_to(top).as_posix() for p in top.rglob("*") if p.is_file())
    v = "vendor/llama.cpp/"
    for kept in ("pyproject.toml", "README.md", "llama_cpp/server/app.py", v + "models/ggml-vocab-qwen2.gguf",
                 v + "tools/mtmd/mtmd.cpp", v + "ggml/src/ggml-cuda/template-instances/mmq-instance-q4_k.cu",
                 v + "ggml/src/ggml-rpc/x.cpp", v + "ggml/src/ggml-blas/x.cpp", v + "vendor/miniaudio/miniaudio.h",
                 v + ".git"):
        assert kept in left, kept
    for gone in ("docs/index.md", "tests/test_llama.py", "CHANGELOG.md", v + "models/ggml-vocab-llama-bpe.gguf",
                 v + "models/templates/x.jinja", v + "tools/server/server.cpp", v + "tools/mtmd/test-1.jpeg",
                 v + "tools/mtmd/tests/t.sh", v + "ggml/src/ggml-vulkan/x.cpp", v + "ggml/src/ggml-metal/x.m",
                 v + "ggml/src/ggml-hip/CMakeLists.txt", v + "convert_hf_to_gguf.py", v + "gguf-py/gguf/x.py",
                 ".git/modules/vendor/llama.cpp/objects/pack/pack-1.pack"):
        assert gone not in left, gone
    assert stats["removed_bytes"] > 0 and stats["kept_bytes"] == 100 * len(left)


def test_strip_refuses_to_drop_a_needed_file(load_script, tmp_path):
    b = load_script("build_gpu_bundle")
    top = _fake_sdist(tmp_path)
    with pytest.raises(b.BundleError, match="ggml-cuda/CMakeLists.txt"):
        b.strip_sdist(top, patterns=b.STRIP + ("vendor/llama.cpp/ggml/src/ggml-cuda",))


def test_bundle_size_check(load_script, tmp_path):
    b = load_script("build_gpu_bundle")
    (tmp_path / "wheels").mkdir()
    with open(tmp_path / "wheels" / "big.whl", "wb") as f:  # sparse: 41 MB long, no disk used
        f.truncate(41_000_000)
    (tmp_path / "manifest.json").write_text("{}")
    with pytest.raises(b.BundleError, match="41.0 MB, over the 40 MB limit"):
        b.check_size(tmp_path)
    assert b.check_size(tmp_path, max_mb=42) == 41_000_002
    os.truncate(tmp_path / "wheels" / "big.whl", 1000)
    assert b.check_size(tmp_path) == 1002


def test_cuda_fixups_take_cublas_from_the_wheels(load_script, tmp_path):
    """A toolkit with nvcc and cudart but no cuBLAS (as pip-assembled CUDA images have), PyTorch's
    nvidia/cu13 wheels with versioned names only, the driver in its mount: CMake gets plain-named links."""
    g = load_script("gpu_check")
    tk, site, drv = tmp_path / "cuda", tmp_path / "site", tmp_path / "nvidia-driver"
    for f in (tk / "lib64/libcudart.so", tk / "include/cuda_runtime.h", site / "nvidia/cu13/lib/libcublas.so.13",
              site / "nvidia/cu13/lib/libcublasLt.so.13", site / "nvidia/cu13/include/cublas_v2.h",
              drv / "libcuda.so.1"):
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text("")
    r = g.cuda_fixups(tmp_path / "work", None, site_dirs=[str(site)], driver_dirs=(str(drv),), toolkits=[str(tk)])
    extra = tmp_path / "work/cuda-extra/lib"
    assert (extra / "libcublas.so").resolve() == (site / "nvidia/cu13/lib/libcublas.so.13").resolve()
    assert (extra / "libcuda.so").resolve() == (drv / "libcuda.so.1").resolve()
    assert r["found"]["cudart"] == str(tk / "lib64/libcudart.so")
    assert f"-DCMAKE_LIBRARY_PATH={extra}" in r["cmake"]
    assert f"-DCMAKE_CUDA_FLAGS=-I{site / 'nvidia/cu13/include'}" in r["cmake"]
    assert "-DGGML_CUDA_NO_VMM=ON" not in r["cmake"]
    assert str(site / "nvidia/cu13/lib") in r["ld_library_path"] and str(drv) not in r["ld_library_path"]

    (drv / "libcuda.so.1").unlink()
    (site / "nvidia/cu13/include/cublas_v2.h").unlink()
    r = g.cuda_fixups(tmp_path / "work2", None, site_dirs=[str(site)], driver_dirs=(str(drv),), toolkits=[str(tk)])
    assert "-DGGML_CUDA_NO_VMM=ON" in r["cmake"] and r["found"]["cuda"] is None
    assert any("cublas_v2.h found nowhere" in n for n in r["notes"])


FAKE_GPU = "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-00000000-1111-2222-3333-444444444444)"


def _fake_nvidia_smi(bin_dir: Path) -> None:
    """An `nvidia-smi` that lists one GPU the way the real `nvidia-smi -L` does (and fails for anything else)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f'#!/bin/sh\nif [ "$1" = "-L" ]; then echo "{FAKE_GPU}"; exit 0; fi\nexit 9\n')
    smi.chmod(0o755)


def _run(tmp_path: Path, path_env: str, *args: str, timeout: float = 120) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / "out"
    env = {**os.environ, "PATH": path_env}
    env.pop("CXX", None)
    cmd = [sys.executable, str(SCRIPT), "--work", str(tmp_path / "work"), "--out", str(out), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO, env=env)
    assert (out / "gpu_check.json").is_file(), proc.stdout + proc.stderr
    return proc, json.loads((out / "gpu_check.json").read_text())


@needs_llama
def test_a_listed_gpu_with_a_cpu_only_build_fails_in_one_line(tmp_path):
    """nvidia-smi lists a GPU, the installed llama.cpp cannot offload: the check stops at inspect, in seconds,
    with one line naming the GPU and why, exit 1, status "failed" (never "ok" without a GPU)."""
    import llama_cpp

    if llama_cpp.llama_supports_gpu_offload():
        pytest.skip("this llama.cpp can offload; the test needs a CPU-only build")
    _fake_nvidia_smi(tmp_path / "bin")
    proc, r = _run(tmp_path, f"{tmp_path / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
                   "--shapes", "tiny", "--skip-build", "--vocab", "synthetic")
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert r["status"] == "failed" and r["environment"]["gpus_listed"] == [FAKE_GPU]
    fail = [x for x in proc.stderr.splitlines() if "FAILED" in x]
    assert len(fail) == 1 and "CPU-only build" in fail[0] and "NVIDIA H100" in fail[0], proc.stderr
    assert "llama_supports_gpu_offload() is false" in r["gpu_not_used"]
    assert r["phases"]["inspect"]["status"] == "failed" and "models" not in r["phases"]  # nothing after it ran
    assert r["ngl"] == "auto" and r["n_gpu_layers"] == 0
    assert "CPU-only build" in (tmp_path / "out" / "gpu_check.md").read_text()


@needs_llama
def test_without_nvidia_smi_no_gpu_is_expected(tmp_path):
    """An nvidia-smi that fails: no GPU seen, no GPU gate (the full tiny check above covers no nvidia-smi)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n")
    smi.chmod(0o755)
    proc, r = _run(tmp_path, f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
                   "--shapes", "tiny", "--skip-build", "--vocab", "synthetic", "--time-budget", "2")
    assert r["environment"]["gpus_listed"] == [] and "gpu_not_used" not in r
    assert r["status"] == "partial" and "FAILED" not in proc.stderr  # the time budget, not a GPU gate


def _fake_bundle(tmp_path: Path, requires: str = "scikit-build-core[pyproject]>=0.9.2") -> Path:
    import io
    import tarfile

    bundle = tmp_path / "bundle"
    bundle.mkdir()
    version = "0.0.1"
    (bundle / "manifest.json").write_text(json.dumps({"llama_cpp_python": version}))
    data = f'[build-system]\nrequires = ["{requires}"]\nbuild-backend = "scikit_build_core.build"\n'.encode()
    with tarfile.open(bundle / f"llama_cpp_python-{version}-stripped.tar.gz", "w:gz") as tar:
        info = tarfile.TarInfo(f"llama_cpp_python-{version}/pyproject.toml")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return bundle


def test_preflight_names_each_missing_build_tool_in_seconds(tmp_path):
    """PATH holding only python (and a GPU-listing nvidia-smi), a build to do: cmake, ninja, the C++ compiler
    and nvcc are each one line, the check exits 2 before the build starts."""
    bin_dir = tmp_path / "bin"
    _fake_nvidia_smi(bin_dir)
    (bin_dir / "python3").symlink_to(sys.executable)
    bundle = _fake_bundle(tmp_path, requires="scikit-build-core[pyproject]>=999.0")
    t = __import__("time").monotonic()
    proc, r = _run(tmp_path, str(bin_dir), "--bundle", str(bundle), "--shapes", "tiny", timeout=60)
    assert __import__("time").monotonic() - t < 30
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = [x for x in proc.stderr.splitlines() if x.startswith("gpu_check: preflight: ")]
    text = "\n".join(lines)
    assert any(x.startswith("gpu_check: preflight: cmake:") for x in lines), text
    assert any(x.startswith("gpu_check: preflight: ninja:") for x in lines), text
    assert any(x.startswith("gpu_check: preflight: C++ compiler:") for x in lines), text
    assert any("build backend: scikit-build-core" in x for x in lines), text  # absent, or older than 999.0
    if not Path("/usr/local/cuda/bin/nvcc").exists() and not Path("/opt/cuda/bin/nvcc").exists():
        assert any(x.startswith("gpu_check: preflight: nvcc:") for x in lines), text
    assert r["phases"]["preflight"]["status"] == "failed" and "build" not in r["phases"]
    assert r["status"] != "ok"


def test_preflight_is_skipped_with_skip_build(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(sys.executable)
    proc, r = _run(tmp_path, str(bin_dir), "--shapes", "tiny", "--skip-build", "--vocab", "synthetic",
                   "--time-budget", "2", timeout=60)
    assert "preflight" not in r["phases"] and "preflight" not in proc.stderr


def test_preflight_passes_with_every_tool(load_script, tmp_path, monkeypatch):
    """Every tool found (fake executables), the backend's version new enough: no line."""
    g = load_script("gpu_check")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("cmake", "ninja", "c++", "nvcc"):
        (bin_dir / tool).write_text("#!/bin/sh\nexit 0\n")
        (bin_dir / tool).chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.delenv("CXX", raising=False)
    import importlib.metadata

    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.11.0")
    problems, found = g.preflight(_fake_bundle(tmp_path), gpu=True)
    assert problems == [] and found["nvcc"] and found["scikit_build_core"] == "0.11.0"


@pytest.mark.parametrize("ngl", ["-5", "abc"])
def test_a_bad_ngl_is_one_line_before_anything_runs(tmp_path, ngl):
    """-ngl as speclocal reads it (the package's resolve_gpu_layers): a bad value is one line, exit 2, and no
    phase ran (no JSON written)."""
    cmd = [sys.executable, str(SCRIPT), "--ngl", ngl, "--skip-build", "--work", str(tmp_path / "work"),
           "--out", str(tmp_path / "out")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 2
    assert proc.stderr.startswith("gpu_check: error: -ngl/--n-gpu-layers must be") and proc.stderr.count("\n") == 1
    assert "Traceback" not in proc.stderr and not (tmp_path / "out" / "gpu_check.json").exists()


def test_ngl_is_speclocal_s_own(load_script):
    from speclocal.models import devices

    g = load_script("gpu_check")
    assert g.tree_devices().resolve_gpu_layers is devices.resolve_gpu_layers  # one definition, not a copy


def test_preflight_wants_nvcc_only_where_a_gpu_is_seen(load_script, tmp_path, monkeypatch):
    import importlib.metadata

    g = load_script("gpu_check")
    monkeypatch.setattr(g, "_find_nvcc", lambda: None)
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.11.0")
    bundle = _fake_bundle(tmp_path)
    with_gpu, _ = g.preflight(bundle, gpu=True)
    without, _ = g.preflight(bundle, gpu=False)
    assert [x for x in with_gpu if x.startswith("nvcc:")] and "CPU-only" in with_gpu[-1]
    assert not [x for x in without if x.startswith("nvcc:")]


def test_summary_shows_sweep_cells_that_measured_nothing(load_script):
    """A cell whose greedy output parted from plain's before any token (random full-shape weights do that) has no
    numbers: the summary says "-" and the cell's token count, as the first end-to-end run needed (it raised)."""
    g = load_script("gpu_check")
    empty = {"k": 8, "rate": 0.9, "tokens": 0, "acceptance_mle": None, "measured": None, "predicted": None,
             "error": None}
    full = {"k": 3, "rate": 0.5, "tokens": 2, "acceptance_mle": 0.0, "measured": 0.315, "predicted": 0.306,
            "error": -0.0297}
    r = {"status": "ok", "shapes": "full", "time_budget_s": 560, "phases": {"synthetic": {"status": "ok", "seconds": 9.0}},
         "synthetic": {"rows": [full, empty], "median_abs_error": 0.0297}}
    md = g.summary_md(r)
    assert "| 8 | 0.90 | - | - | - | - | 0 |" in md and "| 3 | 0.50 | 0.00 | 0.315x | 0.306x | -3.0 % | 2 |" in md
    assert "Median |error| 3.0 %" in md
