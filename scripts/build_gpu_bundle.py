#!/usr/bin/env python3
"""Build the bundle that `scripts/gpu_check.py` needs on a GPU machine with no network at all.

    python scripts/build_gpu_bundle.py [--out gpu-bundle] [--sdist PATH] [--max-mb 40]

The bundle (a gitignored folder, carried to the GPU machine with the working tree) holds:
- a stripped copy of the pinned llama-cpp-python sdist (`pip download --no-binary :all:`): docs, examples,
  tests, tools (except tools/mtmd, which the package's default CMake options still build), the vendored
  models (except `ggml-vocab-qwen2.gguf`, the real Qwen2 vocabulary the check's models use) and the
  sources of GPU/NPU backends that a Linux CUDA build never compiles are removed;
- our own wheel (`pip wheel --no-deps` of this project);
- py3.12 wheels of the dependencies that the GPU machine's image lacks:
  gguf, diskcache (imported by llama_cpp itself), platformdirs, textual and its missing deps;
- manifest.json: versions, sizes, sha256 of every file, the speclocal source hash the wheel was built from.

It prints the bundle's size and fails when it is over the limit (the working tree that travels is 64 MiB
in all; the bundle must stay under 40 MB).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
from importlib import metadata
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_check import BUNDLE_WHEELS_DIR, SDIST_NAME, VOCAB_MEMBER, source_hash  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
MAX_MB = 40  # decimal megabytes: 40,000,000 bytes, well inside the 64 MiB the working tree may take
PY_VERSION = "3.12"  # the GPU machine's python3 (3.12.3)
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64")

# On the GPU machine's image already (tests/test_gpu_bundle.py installs these, and no more, into a fresh venv).
IMAGE_PACKAGES = ("numpy", "psutil", "jinja2", "typing-extensions", "huggingface-hub", "matplotlib", "tqdm", "pyyaml",
                  "requests", "rich", "markdown-it-py", "pygments")
# Missing there: what speclocal and llama_cpp import.
EXTRA_WHEELS = ("gguf", "diskcache", "platformdirs", "textual", "mdit-py-plugins", "linkify-it-py", "uc-micro-py")

V = "vendor/llama.cpp/"
# Paths (globs, relative to the sdist's top folder) the CUDA build of the library does not need.
STRIP = (
    # the Python package's own extras, and its git repository (sdist.include has ".git": a 38 MB pack; the
    # build only asks git for a commit id, and vendor/llama.cpp/.git, kept, then points nowhere: "unknown")
    ".git", "docs", "examples", "tests", "docker", "scripts", ".github", "mkdocs.yml", "CHANGELOG.md",
    "CONTRIBUTING.md", "Makefile",
    # llama.cpp: everything but the library, common (forced on by the package's CMakeLists), vendor/ and mtmd
    *(V + p for p in (
        ".devops", ".github", ".gemini", ".pi", "app", "benches", "ci", "conversion", "docs", "examples", "gguf-py",
        "grammars", "media", "pocs", "requirements", "scripts", "skills", "tests", "convert_*.py",
        "requirements.txt", "flake.nix", "build-xcframework.sh", "Makefile", "models/*", "tools/*",
        "tools/mtmd/test-*", "tools/mtmd/tests", "tools/mtmd/tests.sh", "tools/mtmd/legacy-models",
    )),
    # ggml backends a Linux CUDA (or CPU) build never adds: each is add_subdirectory'd only when its
    # GGML_<NAME> option is on (ggml/src/CMakeLists.txt: ggml_add_backend). HIP and MUSA reuse ggml-cuda's
    # sources from their own folders; Metal is macOS only. Kept: cpu, cuda, blas, rpc.
    *(V + "ggml/src/ggml-" + b for b in (
        "cann", "et", "hexagon", "hip", "metal", "musa", "opencl", "openvino", "sycl", "virtgpu", "vulkan",
        "webgpu", "zdnn", "zendnn",
    )),
)
KEEP = (V + "models/ggml-vocab-qwen2.gguf", V + "tools/mtmd")
REQUIRED = (
    "pyproject.toml", "CMakeLists.txt", "PKG-INFO", "README.md", "LICENSE.md", "llama_cpp/__init__.py",
    "llama_cpp/llama_cpp.py", V + "CMakeLists.txt", V + "cmake", V + "include/llama.h", V + "src", V + "common/CMakeLists.txt",
    V + "vendor/CMakeLists.txt", V + "ggml/CMakeLists.txt", V + "ggml/src/ggml-cpu/CMakeLists.txt",
    V + "ggml/src/ggml-cuda/CMakeLists.txt", V + "tools/mtmd/CMakeLists.txt", VOCAB_MEMBER,
)


class BundleError(Exception):
    pass


def say(msg: str) -> None:
    print(f"build_gpu_bundle: {msg}", flush=True)


def _tree_bytes(path: Path) -> int:
    if path.is_file() or path.is_symlink():
        return path.lstat().st_size
    return sum(p.lstat().st_size for p in path.rglob("*") if p.is_file() or p.is_symlink())


def _protected(rel: str) -> bool:
    """A path that is, or holds, something we keep."""
    return any(rel == k or k.startswith(rel + "/") for k in KEEP)


def strip_sdist(root: Path, patterns: tuple[str, ...] = STRIP) -> dict:
    """Delete what the library build does not need from an unpacked sdist (in place); return what went.

    Raises BundleError if a file the build needs is missing afterwards."""
    removed: list[str] = []
    removed_bytes = 0
    for pattern in patterns:
        for p in sorted(root.glob(pattern)):
            rel = p.relative_to(root).as_posix()
            if _protected(rel) or not (p.exists() or p.is_symlink()):
                continue
            removed_bytes += _tree_bytes(p)
            removed.append(rel)
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()
    missing = [r for r in REQUIRED if not (root / r).exists()]
    if missing:
        raise BundleError(f"stripping removed what the build needs: {', '.join(missing)}")
    return {"removed": removed, "removed_bytes": removed_bytes, "kept_bytes": _tree_bytes(root)}


def bundle_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def check_size(path: Path, max_mb: float = MAX_MB) -> int:
    """The bundle's size in bytes; BundleError if it is over max_mb (decimal MB)."""
    size = bundle_size(path)
    if size > max_mb * 1e6:
        raise BundleError(f"the bundle is {size / 1e6:.1f} MB, over the {max_mb:g} MB limit "
                          f"(the working tree that travels to the GPU machine is 64 MiB in all)")
    return size


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _run(cmd: list[str], **kw) -> None:
    say("$ " + " ".join(cmd))
    r = subprocess.run(cmd, **kw)
    if r.returncode != 0:
        raise BundleError(f"command failed with exit code {r.returncode}: {' '.join(cmd)}")


def pinned_llama_version() -> str:
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    for d in deps:
        m = re.match(r"\s*llama[-_]cpp[-_]python\s*==\s*([\w.]+)", d)
        if m:
            return m.group(1)
    raise BundleError("pyproject.toml pins no llama-cpp-python version (llama-cpp-python==X)")


def _pin(name: str) -> str:
    """NAME==VERSION as installed here (the combination the test suite ran with), else NAME."""
    try:
        return f"{name}=={metadata.version(name)}"
    except metadata.PackageNotFoundError:
        return name


def repack(src_root: Path, out: Path) -> None:
    """tar.gz of src_root with its folder name on top, in a stable order, owner-neutral."""
    def clean(ti: tarfile.TarInfo) -> tarfile.TarInfo:
        ti.uid = ti.gid = 0
        ti.uname = ti.gname = ""
        return ti

    with tarfile.open(out, "w:gz", compresslevel=9) as tar:
        for p in [src_root, *sorted(src_root.rglob("*"))]:
            tar.add(p, arcname=p.relative_to(src_root.parent).as_posix(), recursive=False, filter=clean)


def _prepare_out(out: Path, force: bool) -> None:
    if out.exists():
        if any(out.iterdir()) and not (out / "manifest.json").exists() and not force:
            raise BundleError(f"{out} exists, is not empty and holds no bundle manifest: refusing to replace it "
                              "(pass --force)")
        shutil.rmtree(out)
    (out / BUNDLE_WHEELS_DIR).mkdir(parents=True)


def _git(*args: str) -> str | None:
    try:
        r = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=10)
        return r.stdout.strip() if r.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def build(out: Path, sdist: Path | None, max_mb: float, python_version: str, force: bool) -> dict:
    t0 = time.perf_counter()
    version = pinned_llama_version()
    pip = [sys.executable, "-m", "pip"]
    _prepare_out(out, force)
    wheels = out / BUNDLE_WHEELS_DIR
    with tempfile.TemporaryDirectory(prefix="gpu-bundle-") as tmp_s:
        tmp = Path(tmp_s)
        if sdist is None:
            _run(pip + ["download", "--no-binary", ":all:", "--no-deps", "-q", "-d", str(tmp / "dl"),
                        f"llama-cpp-python=={version}"])
            found = sorted((tmp / "dl").glob("llama_cpp_python-*.tar.gz"))
            if len(found) != 1:
                raise BundleError(f"expected one llama_cpp_python sdist, pip left {[f.name for f in found]}")
            sdist = found[0]
        say(f"unpacking {sdist.name} ({sdist.stat().st_size / 1e6:.1f} MB)")
        with tarfile.open(sdist) as tar:
            tar.extractall(tmp / "src", filter="data")
        tops = [p for p in (tmp / "src").iterdir()]
        if len(tops) != 1 or not (tops[0] / "pyproject.toml").exists():
            raise BundleError(f"{sdist} is not an sdist with one top folder")
        top = tops[0]
        if top.name != f"llama_cpp_python-{version}":
            raise BundleError(f"{sdist.name} is not llama-cpp-python {version} (found {top.name})")
        unpacked = _tree_bytes(top)
        head = top / ".git" / "modules" / "vendor" / "llama.cpp" / "HEAD"
        llama_commit = head.read_text().strip() if head.is_file() else None
        stats = strip_sdist(top)
        say(f"stripped {len(stats['removed'])} paths, {stats['removed_bytes'] / 1e6:.0f} MB; "
            f"{stats['kept_bytes'] / 1e6:.1f} MB of sources left")
        target = out / SDIST_NAME.format(version=version)
        repack(top, target)
        say(f"{target.name}: {target.stat().st_size / 1e6:.1f} MB")
        original_sdist_bytes = sdist.stat().st_size

    _run(pip + ["wheel", "--no-deps", "-q", "-w", str(wheels), str(REPO)])
    pure = ["download", "--no-deps", "--only-binary=:all:", "-q", "--python-version", python_version,
            "--implementation", "cp", *[a for p in PLATFORMS for a in ("--platform", p)], "-d", str(wheels)]
    pins = [_pin(n) for n in EXTRA_WHEELS]
    _run(pip + pure + pins)
    names = sorted(p.name for p in wheels.glob("*.whl"))
    dists = [re.sub(r"[-_.]+", "-", n.split("-")[0]).lower() for n in names]
    if len(set(dists)) != len(dists):
        raise BundleError(f"two versions of one package in the bundle (pip would refuse both): {names}")

    manifest = {
        "schema": 1,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "llama_cpp_python": version,
        "llama_cpp_commit": llama_commit,
        "sdist": {"file": target.name, "original_bytes": original_sdist_bytes, "unpacked_bytes": unpacked,
                  "stripped_bytes": stats["kept_bytes"], "removed": stats["removed"]},
        "speclocal_source_sha256": source_hash(REPO),
        "git_commit": _git("rev-parse", "HEAD"),
        "git_dirty": bool(_git("status", "--porcelain", "--", "app", "pyproject.toml")),
        "python_version": python_version,
        "wheel_pins": pins,
        "files": {p.relative_to(out).as_posix(): {"bytes": p.stat().st_size, "sha256": _sha256(p)}
                  for p in sorted(out.rglob("*")) if p.is_file()},
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    size = check_size(out, max_mb)
    manifest["total_bytes"] = size
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    say(f"bundle {out}: {size / 1e6:.1f} MB (limit {max_mb:g} MB), {len(names)} wheels: {', '.join(names)}; "
        f"{time.perf_counter() - t0:.0f} s")
    return manifest


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(REPO / "gpu-bundle"), help="bundle folder (default: gpu-bundle in the repo)")
    p.add_argument("--sdist", type=Path, help="a llama-cpp-python sdist already downloaded (default: pip download)")
    p.add_argument("--max-mb", type=float, default=MAX_MB, help=f"size limit in MB (default {MAX_MB})")
    p.add_argument("--python-version", default=PY_VERSION, help=f"the GPU machine's Python (default {PY_VERSION})")
    p.add_argument("--force", action="store_true", help="replace --out even if it is not a bundle")
    args = p.parse_args(argv)
    try:
        build(Path(args.out).resolve(), args.sdist, args.max_mb, args.python_version, args.force)
    except BundleError as e:
        print(f"build_gpu_bundle: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
