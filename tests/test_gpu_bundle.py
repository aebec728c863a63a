"""The GPU check's whole path on this CPU, as it runs on a GPU machine with no network: build the bundle
(scripts/build_gpu_bundle.py, where pip reaches PyPI), then in a fresh venv holding only what the GPU machine's
image has, with the network cut off (`unshare -n`): build llama-cpp-python from the bundled sdist, install it
with our wheel and the bundled wheels, make the models and run every phase (tiny shapes).

About 10 minutes on 2 cores (the build): marked slow, run with `pytest --slow tests/test_gpu_bundle.py`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = REPO / "scripts"


def _offline(cmd: list[str]) -> tuple[list[str], str]:
    """cmd with no network reachable: in a network namespace of its own (only a loopback, down) where the
    machine allows one; else pip told to use no index and every proxy pointed at a closed port."""
    try:
        if subprocess.run(["unshare", "-n", "true"], capture_output=True, timeout=10).returncode == 0:
            return ["unshare", "-n", *cmd], "unshare -n"
    except (OSError, subprocess.SubprocessError):
        pass
    return cmd, "PIP_NO_INDEX=1, proxies at 127.0.0.1:9"


@pytest.mark.slow
@pytest.mark.models
def test_bundle_offline_build_install_every_phase(tmp_path, load_script):
    b = load_script("build_gpu_bundle")
    bundle = tmp_path / "bundle"
    r = subprocess.run([sys.executable, str(SCRIPTS / "build_gpu_bundle.py"), "--out", str(bundle)],
                       capture_output=True, text=True, timeout=600, cwd=REPO)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["total_bytes"] < b.MAX_MB * 1e6
    assert any(f.startswith("wheels/speclocal-") for f in manifest["files"])

    # the GPU machine's image: a fresh venv with its packages and the build backend, nothing of ours
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    py = str(venv / "bin" / "python")
    r = subprocess.run([py, "-m", "pip", "install", "-q", *b.IMAGE_PACKAGES, "scikit-build-core"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert subprocess.run([py, "-c", "import llama_cpp"], capture_output=True).returncode != 0  # not there yet

    work, out = tmp_path / "work", tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PIP_FIND_LINKS", "PIP_INDEX_URL",
                                                           "PIP_EXTRA_INDEX_URL")}
    env.update(PIP_CONFIG_FILE=os.devnull)  # no configured index, find-links or local mirror either
    cmd, how = _offline([py, str(SCRIPTS / "gpu_check.py"), "--bundle", str(bundle), "--backend", "cpu",
                         "--shapes", "tiny", "--work", str(work), "--out", str(out), "--build-cap", "1500",
                         "--time-budget", "2400"])
    if how.startswith("PIP_NO_INDEX"):
        env.update(PIP_NO_INDEX="1", http_proxy="http://127.0.0.1:9", https_proxy="http://127.0.0.1:9",
                   HTTP_PROXY="http://127.0.0.1:9", HTTPS_PROXY="http://127.0.0.1:9")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=2500, cwd=tmp_path, env=env)
    res = json.loads((out / "gpu_check.json").read_text())
    assert proc.returncode == 0 and res["status"] == "ok", (how, proc.stdout[-3000:], proc.stderr[-3000:])
    phases = res["phases"]
    assert [n for n in phases][:5] == ["environment", "preflight", "build", "install", "inspect"]
    assert all(p["status"] == "ok" for p in phases.values()), phases
    assert res["llama_from"] == "this build" and res["build"]["wheel"]["file"].startswith("llama_cpp_python-0.3.36")
    assert Path(res["llama"]["llama_cpp_file"]).resolve().is_relative_to((work / "site").resolve())
    assert res["speclocal_source"]["from"] == "wheel"  # built from this tree a minute ago
    installed = set(res["install"]["wheels"])
    assert {w.rsplit("/", 1)[-1] for w in manifest["files"] if w.startswith("wheels/")
            and not w.startswith("wheels/speclocal-")} <= installed
    vocab = res["models"]["vocab"]  # the real Qwen2 vocabulary, out of the sdist the build unpacked
    assert vocab["source"].startswith("real Qwen2") and Path(vocab["path"]).is_relative_to(work / "src")
    assert res["prediction_summary"]["runs"] == 4
