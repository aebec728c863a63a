#!/usr/bin/env python3
"""GPU check: build llama.cpp for the GPU, make a model pair, measure, in one command of at most 10 minutes.

For a Linux machine with an NVIDIA GPU, CUDA's compiler and no network at all. Everything it needs
comes with the working tree: the bundle that `scripts/build_gpu_bundle.py` makes (a stripped
llama-cpp-python sdist, our wheel, the wheels the machine lacks). On the GPU machine, in the repo root:

    python3 scripts/gpu_check.py --bundle gpu-bundle --out $OUT

Phases in the order they run, each time-boxed inside --time-budget, each written to the JSON as soon as
it ends (a failed or timed-out phase leaves a partial JSON; later phases that need it are skipped and say
why). The most valuable numbers come first: the profile, plain vs draft vs self-draft at k = 3 then 8, the
prediction against them; the synthetic sweep, the least needed, runs last. Seconds: what each phase is
expected to take on the 16-core device machine with full shapes (ESTIMATE, what the time-boxing reserves;
the build's is a guess from ggml-cuda's file count for one architecture: no GPU has been lent yet) / on a
2-core CPU with --shapes tiny (measured by tests/test_gpu_check.py):
  environment    ~1 / <1  python, CPU, nvidia-smi (-L: is a GPU there?), nvcc, the bundle's manifest
  preflight      ~1 / -   (only when it builds) cmake, ninja, a C++ compiler, nvcc where nvidia-smi lists a
                          GPU, the build backend (scikit-build-core) at the version the sdist asks for: each
                          missing piece is one line and exit 2, in the first seconds, not minutes in
  build       ~240-420 / -  llama-cpp-python from the bundled sdist, -DGGML_CUDA=on
                          -DCMAKE_CUDA_ARCHITECTURES=native (no tests/examples/tools/server/mtmd;
                          FlashAttention kernels in, as a normal CUDA build has them, unless --no-cuda-fa),
                          all cores (capped by --build-cap, default 420 s)
  install       ~10 / -   that wheel, our wheel and the bundled wheels into a target folder, offline
  inspect       ~10 / <1  llama.cpp's system info, GPU offload support, devices (name, memory), versions
  models        ~60 / 1   random-weight Qwen2 GGUFs shaped like Qwen2.5-1.5B (main) and Qwen2.5-0.5B (draft)
                          with the real Qwen2 vocabulary (llama.cpp's models/ggml-vocab-qwen2.gguf), written
                          f16 with the gguf package, quantized to Q4_K_M by llama_model_quantize, then loaded
                          once to check the logits are finite and no end-of-generation token wins greedily
                          (weights conditioned so each token has one clear greedy successor: see INIT_STD)
  profile       ~15 / 1   `speclocal profile --json --refresh` for main + draft, then main + main (self-draft)
  run:NAME      ~15 / 1   each: `speclocal run --json --mode compare --against spec` plain vs the draft
                          (other random weights: acceptance ~0, its cost) and vs self-draft (-md MAIN:
                          acceptance ~1.0): draft-k3, self-k3, draft-k8, self-k8; then self-k8-host, self-k8
                          with --no-backend-sampling (each row's logits copied to the host, sampled in numpy),
                          against self-k8 sampled on the device, as -ngl auto on a GPU samples
  predict        ~5 / <1  the cost model's predicted speedup for each run (its own acceptance, the profile's
                          V(n) and c) against the measured one
  synthetic     ~15 / 1   `speclocal profile --sweep --sweep-charge`: synthetic acceptance 0.5/0.8/0.9 at
                          k = 3/8 (the main model's own continuation, right at the set rate, paying the draft
                          model's time), measured speedup against the cost model's prediction
Full shapes with a build: about 7-10 minutes in all, inside one 10-minute device command.
Where `nvidia-smi -L` lists a GPU, the check cannot end "ok" without computing on it: a CPU-only build
(no nvcc, or llama_supports_gpu_offload() false), or no layer offloaded, stops it with one line saying why
and exit 1 (status "failed"). Every run passes `-ngl auto`, what users get, unless --ngl says otherwise.
Writes gpu_check.json, gpu_check.md (a short summary), gpu_check.log (every subprocess's output) and
build.log to --out.

`--shapes tiny --skip-build` runs the same phases on a CPU with the llama-cpp-python already installed
(tests/test_gpu_check.py does, so the script cannot rot).
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import math
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import threading
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCHEMA = 1
SDIST_NAME = "llama_cpp_python-{version}-stripped.tar.gz"
BUNDLE_WHEELS_DIR = "wheels"
VOCAB_MEMBER = "vendor/llama.cpp/models/ggml-vocab-qwen2.gguf"
DEFAULT_BUDGET = 560  # seconds: one device command may run 600

# Real hyperparameters: Qwen2.5-1.5B(-Instruct) and Qwen2.5-0.5B(-Instruct) config.json, the same as the
# Coder models of the default pair (their GGUF headers: qwen2.block_count 28 / 24, embedding_length 1536 / 896,
# feed_forward_length 8960 / 4864, head_count 12 / 14, head_count_kv 2, rope.freq_base 1e6, rms eps 1e-6,
# context 32768). The HF configs tie the output matrix to the token embeddings, but the official GGUFs that
# speclocal runs (Qwen/Qwen2.5-Coder-*-Instruct-GGUF) carry a separate output.weight, so we do too
# ("tied": False): the output matrix is 15-27 % of these models' weights and of their decode cost.
SHAPES = {
    "full": {
        "main": {"label": "Qwen2.5-1.5B-shaped", "n_layer": 28, "n_embd": 1536, "n_head": 12, "n_head_kv": 2,
                 "n_ff": 8960},
        "draft": {"label": "Qwen2.5-0.5B-shaped", "n_layer": 24, "n_embd": 896, "n_head": 14, "n_head_kv": 2,
                  "n_ff": 4864},
    },
    "tiny": {
        "main": {"label": "tiny main", "n_layer": 4, "n_embd": 128, "n_head": 4, "n_head_kv": 2, "n_ff": 384},
        "draft": {"label": "tiny draft", "n_layer": 2, "n_embd": 64, "n_head": 4, "n_head_kv": 2, "n_ff": 192},
    },
}
ARCH = {"context_length": 32768, "rope_freq_base": 1e6, "rms_eps": 1e-6, "tied": False}
# Std of each matrix's normal init (f16; norms 1, biases 0). One scale everywhere makes a chaotic model whose
# ~150k logits nearly tie: a batched verify pass and single-token decoding round differently and their greedy
# outputs part within a few tokens. So the residual stream stays the token's embedding (std 1; each block's
# output projections add std-0.002 branches), and output row r is the embedding of r's predecessor in a fixed
# random order of the plain tokens, scaled so its logit is ~sqrt(n_embd) against ~N(0, 1) for every other
# token: each token has one clear successor, greedy decoding survives batch-shape rounding, self-draft accepts
# ~everything (the draft, other random weights, ~nothing: it measures cost). The shapes, hence costs, are real.
INIT_STD = {"embd": 1.0, "normal": 0.02, "branch": 0.002}
QUANTS = {"q4_k_m": 15, "q4_0": 2}  # llama_ftype: LLAMA_FTYPE_MOSTLY_Q4_K_M, LLAMA_FTYPE_MOSTLY_Q4_0

# (name, draft model, k). "self" drafts with the main model itself: acceptance ~1.0 (greedy); "draft", other
# random weights, agrees with main ~never (acceptance ~0: what drafting costs). The pair first at each k,
# self-draft (the ceiling) beside it; k = 3 (the default) before k = 8.
# (name, draft, k, extra flags); self-k8-host: self-k8 with every row's logits copied to the host and sampled there
# (-ngl auto puts every layer on the GPU, where speclocal samples on the device): what that saves
RUNS = (("draft-k3", "draft", 3, ()), ("self-k3", "self", 3, ()), ("draft-k8", "draft", 8, ()),
        ("self-k8", "self", 8, ()), ("self-k8-host", "self", 8, ("--no-backend-sampling",)))
N_PREDICT = {"full": 256, "tiny": 48}
N_CTX = 1024
PROMPT = ("Write a Python function that parses a CSV file of orders (id, customer, amount, date), "
          "groups the amounts by customer and month, and returns the totals as a nested dictionary. "
          "Add type hints and a docstring.")

# Expected seconds of each phase on the H200 machine (full) and on a 2-core CPU (tiny): what a phase
# leaves to the ones after it. Each phase's own limit is its cap, or less when the budget is short.
ESTIMATE = {
    "full": {"install": 10, "inspect": 10, "models": 60, "profile": 15, "run": 15, "predict": 5},
    "tiny": {"install": 10, "inspect": 10, "models": 10, "profile": 10, "run": 10, "predict": 5},
}
# What the summary states beside each phase's seconds: expected on the 16-core device machine, full shapes
# (the build's figure is the upper end of a guess until a GPU run records it).
EXPECTED_16CORE = {"environment": 1, "preflight": 1, "build": 420, "profile_self": ESTIMATE["full"]["profile"],
                   "synthetic": ESTIMATE["full"]["run"], **ESTIMATE["full"]}
CAP = {"environment": 30, "preflight": 30, "build": 420, "install": 120, "inspect": 60, "models": 240, "profile": 120,
       "run": 120, "predict": 30}
MIN_PHASE_S = 8

CMAKE_COMMON = ("-DLLAVA_BUILD=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
                "-DLLAMA_BUILD_TOOLS=OFF", "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_BUILD_APP=OFF",
                "-DLLAMA_OPENSSL=OFF")
CMAKE_CUDA = ("-DGGML_CUDA=on", "-DCMAKE_CUDA_ARCHITECTURES=native", "-DGGML_CUDA_NCCL=OFF",
              "-DGGML_CUDA_COMPRESSION_MODE=none")


class PhaseError(Exception):
    """A phase failed in a way worth one line in the JSON (no traceback)."""


class PhaseTimeout(PhaseError):
    pass


class GpuNotUsed(Exception):
    """nvidia-smi lists a GPU but this run would not (or did not) compute on it: the check fails."""


def source_hash(repo: Path) -> str:
    """sha256 over speclocal's sources (app/speclocal, pyproject.toml): which code a wheel was built from."""
    h = hashlib.sha256()
    files = [p for p in sorted((repo / "app" / "speclocal").rglob("*"))
             if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"]
    for p in [repo / "pyproject.toml", *files]:
        if p.is_file():
            h.update(p.relative_to(repo).as_posix().encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


# =====================================================================================================
# The orchestrator: stdlib only (it runs before anything is installed)
# =====================================================================================================

class Check:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.t0 = time.monotonic()
        self.deadline = self.t0 + args.time_budget
        self.out = Path(args.out).resolve()
        self.out.mkdir(parents=True, exist_ok=True)
        self.work = Path(args.work).resolve()
        self.work.mkdir(parents=True, exist_ok=True)
        self.site = self.work / "site"
        self.bundle = Path(args.bundle).resolve() if args.bundle else None
        self.log_path = self.out / "gpu_check.log"
        self.log_path.write_text("")
        self._log_lock = threading.Lock()
        self.est = ESTIMATE[args.shapes]
        self.result: dict = {
            "schema": SCHEMA, "status": "running", "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "argv": sys.argv[1:], "shapes": args.shapes, "time_budget_s": args.time_budget,
            "phases": {}, "runs": {},
        }
        self.ngl: str = args.ngl  # what every run passes as -ngl (default "auto": what users get)
        self.n_gpu_layers: int = 0  # what it resolves to in this build (llama.cpp: negative = every layer)
        self.models: dict[str, Path] = {}
        self.pythonpath: list[str] = []
        self.vocab: Path | None = None
        self.cuda: dict = {}

    # ---- output --------------------------------------------------------------------------------
    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def say(self, msg: str) -> None:
        line = f"[{self.elapsed():6.1f}s] {msg}"
        print(line, flush=True)
        self.log(line)

    def log(self, text: str) -> None:
        with self._log_lock, self.log_path.open("a", encoding="utf-8", errors="replace") as f:
            f.write(text if text.endswith("\n") else text + "\n")

    def save(self) -> None:
        self.result["elapsed_s"] = round(self.elapsed(), 1)
        tmp = self.out / "gpu_check.json.tmp"
        tmp.write_text(json.dumps(self.result, indent=1, default=str) + "\n")
        os.replace(tmp, self.out / "gpu_check.json")

    # ---- subprocesses --------------------------------------------------------------------------
    def env(self) -> dict:
        env = dict(os.environ)
        if self.pythonpath:
            env["PYTHONPATH"] = os.pathsep.join(self.pythonpath + [p for p in [env.get("PYTHONPATH")] if p])
        if self.cuda.get("ld_library_path"):
            env["LD_LIBRARY_PATH"] = os.pathsep.join(self.cuda["ld_library_path"]
                                                     + [p for p in [env.get("LD_LIBRARY_PATH")] if p])
        env["PYTHONUNBUFFERED"] = "1"
        env["HF_HUB_OFFLINE"] = "1"
        catalogue = REPO / "models.toml"
        if catalogue.is_file():  # an installed wheel does not carry the catalogue (it sits at the repo root)
            env["SPECLOCAL_CATALOGUE"] = str(catalogue)
        for var, sub in (("XDG_CACHE_HOME", "cache"), ("XDG_CONFIG_HOME", "config"), ("XDG_STATE_HOME", "state"),
                         ("XDG_DATA_HOME", "data")):  # profiles, priors, settings: never the user's own
            env[var] = str(self.work / "xdg" / sub)
        return env

    def run_proc(self, label: str, cmd: list[str], timeout: float, env: dict | None = None,
                 capture: bool = False, log_file: Path | None = None, echo=None) -> tuple[int, str]:
        """Run cmd in a session of its own. stdout is returned if capture, else logged; stderr is logged
        (to log_file if given, else gpu_check.log). Lines for which echo(line) returns text are printed.
        A run past `timeout` is killed with its whole process group: PhaseTimeout."""
        self.log(f"----- {label}: {' '.join(cmd)}")
        sink = log_file.open("a", encoding="utf-8", errors="replace") if log_file else None
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env or self.env(),
                                text=True, errors="replace", start_new_session=True, cwd=str(REPO))
        captured: list[str] = []

        def pump(stream, keep: bool) -> None:
            for line in stream:
                if keep:
                    captured.append(line)
                    continue
                if sink:
                    sink.write(line)
                else:
                    self.log(line)
                msg = echo(line) if echo else None
                if msg:
                    self.say(msg)

        threads = [threading.Thread(target=pump, args=(proc.stdout, capture), daemon=True),
                   threading.Thread(target=pump, args=(proc.stderr, False), daemon=True)]
        for t in threads:
            t.start()
        try:
            proc.wait(timeout=max(timeout, 1))
        except subprocess.TimeoutExpired:
            self._kill(proc)
            raise PhaseTimeout(f"{label}: still running after {timeout:.0f} s, stopped") from None
        except BaseException:
            self._kill(proc)
            raise
        finally:
            for t in threads:
                t.join(timeout=10)
            if sink:
                sink.close()
        return proc.returncode, "".join(captured)

    @staticmethod
    def _kill(proc: subprocess.Popen) -> None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5)
        except (ProcessLookupError, PermissionError):
            pass

    def worker(self, kind: str, payload: dict, timeout: float, label: str | None = None) -> dict:
        """This script's --_worker KIND in the prepared environment; returns the JSON it writes."""
        result_file = self.work / f"worker-{kind}.json"
        result_file.unlink(missing_ok=True)
        payload_file = self.work / f"worker-{kind}-in.json"
        payload_file.write_text(json.dumps(payload, default=str))
        cmd = [sys.executable, str(Path(__file__).resolve()), "--_worker", kind, "--_in", str(payload_file),
               "--_result", str(result_file)]
        rc, _ = self.run_proc(label or kind, cmd, timeout,
                              echo=lambda line: f"{kind}: {line[3:].strip()}" if line.startswith("@@ ") else None)
        data = json.loads(result_file.read_text()) if result_file.is_file() else None
        if rc != 0 or data is None:
            err = (data or {}).get("error") or f"exit code {rc} (see gpu_check.log)"
            raise PhaseError(f"{kind} worker failed: {err}")
        return data

    def speclocal(self, label: str, cli_args: list[str], timeout: float) -> dict:
        """The real CLI (`python -m speclocal.cli`, what the `speclocal` script runs) with --json."""
        rc, out = self.run_proc(label, [sys.executable, "-m", "speclocal.cli", *cli_args], timeout, capture=True)
        if rc != 0:
            self.log(out)
            raise PhaseError(f"speclocal {cli_args[0]} exited with {rc} (its stderr is in gpu_check.log)")
        try:
            return json.loads(out)
        except ValueError:
            self.log(out)
            raise PhaseError(f"speclocal {cli_args[0]} printed no JSON") from None

    # ---- phases --------------------------------------------------------------------------------
    def phase(self, name: str, fn, needs: tuple[str, ...] = (), reserve: float = 0.0, cap_key: str | None = None,
              always: bool = False):
        rec = self.result["phases"].setdefault(name, {})
        missing = [n for n in needs if self.result["phases"].get(n, {}).get("status") not in ("ok", "reused")]
        if missing:
            rec.update(status="skipped", reason=f"needs {', '.join(missing)}")
            self.say(f"{name}: skipped ({rec['reason']})")
            self.save()
            return None
        cap = self.args.build_cap if name == "build" else CAP[cap_key or name] * self.args.cap_scale
        timeout = cap if always else min(cap, self.remaining() - reserve)
        if timeout < MIN_PHASE_S:
            rec.update(status="skipped", reason=f"time budget: {self.remaining():.0f} s left, "
                                                f"{reserve:.0f} s kept for the phases after it")
            self.say(f"{name}: skipped ({rec['reason']})")
            self.save()
            return None
        rec.update(status="running", timeout_s=round(timeout), started_at_s=round(self.elapsed(), 1))
        self.say(f"{name}: start (limit {timeout:.0f} s)")
        self.save()
        t = time.monotonic()
        value = None
        try:
            value = fn(timeout)
            rec["status"] = value if value == "not-run" else "ok"
        except GpuNotUsed as e:
            rec.update(status="failed", error=str(e), seconds=round(time.monotonic() - t, 1))
            self.save()
            raise
        except PhaseTimeout as e:
            rec.update(status="timeout", error=str(e))
        except PhaseError as e:
            rec.update(status="failed", error=str(e))
        except Exception as e:  # noqa: BLE001 - a bug in one phase must still leave the JSON
            rec.update(status="failed", error=f"{type(e).__name__}: {e}")
            self.log(traceback.format_exc())
        rec["seconds"] = round(time.monotonic() - t, 1)
        self.say(f"{name}: {rec['status']} in {rec['seconds']:.1f} s" + (f" - {rec['error']}" if "error" in rec else ""))
        self.save()
        return value

    def later(self, *phases: str, runs: int = 0) -> float:
        """Seconds the listed later phases are expected to need."""
        return sum(self.est[p] for p in phases) + runs * self.est["run"]

    def phase_environment(self, timeout: float) -> None:
        env = {"python": sys.version.split()[0], "executable": sys.executable, "platform": platform.platform(),
               "machine": platform.machine(), "cpu_count": os.cpu_count(), "cpu": _cpu_name(),
               "hostname": platform.node()}
        env["gpus_listed"] = _gpus_listed()
        env["nvidia_smi"] = _nvidia_smi() if env["gpus_listed"] else None
        nvcc = _find_nvcc()
        env["nvcc"] = {"path": nvcc, "version": _nvcc_version(nvcc) if nvcc else None}
        if nvcc:
            self.cuda = env["cuda_libraries"] = cuda_fixups(self.work, nvcc)
        env["cmake"] = _first_line(["cmake", "--version"])
        env["ninja"] = _first_line(["ninja", "--version"])
        env["git_commit"] = _first_line(["git", "-C", str(REPO), "rev-parse", "HEAD"])
        env["speclocal_tree_sha256"] = source_hash(REPO)
        if self.bundle is not None:
            mf = self.bundle / "manifest.json"
            if not mf.is_file():
                raise PhaseError(f"no bundle at {self.bundle} (manifest.json missing): run "
                                 "scripts/build_gpu_bundle.py where pip can reach PyPI, and carry the folder")
            manifest = json.loads(mf.read_text())
            env["bundle"] = {k: manifest.get(k) for k in ("created_at", "llama_cpp_python", "llama_cpp_commit",
                                                          "git_commit", "git_dirty",
                                                          "speclocal_source_sha256", "total_bytes", "wheel_pins")}
        self.result["environment"] = env
        gpus = env["nvidia_smi"].get("gpus") if env["nvidia_smi"] else None
        self.say(f"environment: python {env['python']}, {env['cpu_count']} CPUs, "
                 f"GPU {', '.join(g['name'] for g in gpus) if gpus else 'listed' if env['gpus_listed'] else 'none'}, nvcc {'yes' if nvcc else 'no'}"
                 + (f"; nvidia-smi -L: {'; '.join(env['gpus_listed'])}" if env["gpus_listed"] else ""))

    def gpu_seen(self) -> str | None:
        """The GPUs `nvidia-smi -L` listed (one string), or None where it is missing or failed."""
        listed = self.result.get("environment", {}).get("gpus_listed") or []
        return "; ".join(listed) or None

    def gpu_fail(self, why: str) -> None:
        raise GpuNotUsed(f"nvidia-smi lists {self.gpu_seen()}, but {why}")

    def phase_preflight(self, timeout: float) -> None:
        """Before the build's minutes: every tool it needs is here, else one line each and a failure."""
        problems, found = preflight(self.bundle, gpu=bool(self.gpu_seen()) and self.args.backend != "cpu")
        self.result["preflight"] = {"found": found, "missing": problems}
        if problems:
            raise PhaseError("; ".join(problems))

    def backend(self) -> str:
        if self.args.backend != "auto":
            return self.args.backend
        smi = self.result.get("environment", {}).get("nvidia_smi") or {}
        return "cuda" if (self.gpu_seen() or smi.get("gpus")) and _find_nvcc() else "cpu"

    def phase_build(self, timeout: float) -> None:
        manifest = json.loads((self.bundle / "manifest.json").read_text())
        version = manifest["llama_cpp_python"]
        tarball = self.bundle / SDIST_NAME.format(version=version)
        src_parent = self.work / "src"
        shutil.rmtree(src_parent, ignore_errors=True)
        src_parent.mkdir(parents=True)
        with tarfile.open(tarball) as tar:
            _extract(tar, src_parent)
        src = src_parent / f"llama_cpp_python-{version}"
        self.vocab = src / VOCAB_MEMBER
        backend = self.backend()
        cmake = list(CMAKE_COMMON)
        if backend == "cuda":
            cmake += [a if not a.startswith("-DCMAKE_CUDA_ARCHITECTURES=") else
                      f"-DCMAKE_CUDA_ARCHITECTURES={self.args.cuda_arch}" for a in CMAKE_CUDA]
            cmake += self.cuda.get("cmake", [])
            if not self.cuda.get("found", {}).get("cublas") or any("found nowhere" in n for n in self.cuda.get("notes", [])):
                raise PhaseError("no cuBLAS for the CUDA build (neither in the CUDA toolkit nor in nvidia-* wheels): "
                                 f"{json.dumps(self.cuda)}")
            if self.args.no_cuda_fa:  # measure as users' builds run unless asked: FA kernels in
                cmake.append("-DGGML_CUDA_FA=OFF")
        jobs = self.args.jobs or os.cpu_count() or 1
        env = self.env()
        env.update(CMAKE_ARGS=" ".join(cmake), CMAKE_BUILD_PARALLEL_LEVEL=str(jobs))
        nvcc = _find_nvcc()
        if nvcc:
            env["PATH"] = str(Path(nvcc).parent) + os.pathsep + env.get("PATH", "")
            env.setdefault("CUDACXX", nvcc)
        wheelhouse = self.work / "wheelhouse"
        shutil.rmtree(wheelhouse, ignore_errors=True)
        build_log = self.out / "build.log"
        build_log.write_text(f"CMAKE_ARGS={env['CMAKE_ARGS']}\n")
        self.result["build"] = {"backend": backend, "cmake_args": cmake, "jobs": jobs, "version": version,
                                "log": build_log.name}
        self.save()
        progress = {"last": 0.0}

        def echo(line: str):
            m = re.match(r"\s*\[(\d+)/(\d+)\]", line)
            if m and time.monotonic() - progress["last"] > 20:
                progress["last"] = time.monotonic()
                return f"build: step {m.group(1)}/{m.group(2)}"
            return None

        cmd = [sys.executable, "-m", "pip", "wheel", "-v", "--no-index", "--no-deps", "--no-build-isolation",
               "-w", str(wheelhouse), "-C", f"build-dir={self.work / 'build'}", str(src)]
        t = time.monotonic()
        rc, _ = self.run_proc("build", cmd, timeout, env=env, log_file=build_log, echo=echo)
        self.result["build"]["seconds"] = round(time.monotonic() - t, 1)
        _cap_file(build_log)
        if rc != 0:
            tail = build_log.read_text(errors="replace").splitlines()[-15:]
            self.log("\n".join(tail))
            raise PhaseError(f"pip wheel exited with {rc}; the end of build.log: {' | '.join(tail[-3:])}")
        wheels = sorted(wheelhouse.glob("llama_cpp_python-*.whl"))
        if not wheels:
            raise PhaseError("the build made no llama_cpp_python wheel")
        self.result["build"]["wheel"] = {"file": wheels[0].name, "bytes": wheels[0].stat().st_size}

    def choose_speclocal(self) -> None:
        """Our wheel from the bundle if it was built from the code in this tree, else the tree's app/."""
        choice, reason = self.args.speclocal_from, ""
        manifest = None
        if self.bundle is not None and (self.bundle / "manifest.json").is_file():
            manifest = json.loads((self.bundle / "manifest.json").read_text())
        wheel = next(iter(sorted((self.bundle / BUNDLE_WHEELS_DIR).glob("speclocal-*.whl"))), None) if manifest else None
        tree_ok = (REPO / "app" / "speclocal" / "__init__.py").is_file()
        if choice == "auto":
            if wheel is None:
                choice, reason = "tree", "no bundle with our wheel"
            elif manifest.get("speclocal_source_sha256") != source_hash(REPO) and tree_ok:
                choice, reason = "tree", "the bundle's wheel was built from other sources than this tree's"
            else:
                choice, reason = "wheel", "the bundle's wheel was built from this tree's sources"
        if choice == "wheel" and wheel is None:
            raise PhaseError("--speclocal-from wheel, but the bundle holds no speclocal wheel")
        self.result["speclocal_source"] = {"from": choice, "reason": reason or "asked for",
                                           "wheel": wheel.name if wheel else None}
        self.pythonpath = ([str(REPO / "app")] if choice == "tree" else []) + (
            [str(self.site)] if self.site.is_dir() else [])

    def phase_install(self, timeout: float) -> None:
        choice = self.result["speclocal_source"]["from"]
        wheels = sorted((self.bundle / BUNDLE_WHEELS_DIR).glob("*.whl"))
        if choice == "tree":
            wheels = [w for w in wheels if not w.name.startswith("speclocal-")]
        built = sorted((self.work / "wheelhouse").glob("llama_cpp_python-*.whl"))
        if not self.args.skip_build:
            wheels = built + wheels
        cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
               "--no-cache-dir", "--upgrade", "--target", str(self.site), *map(str, wheels)]
        rc, _ = self.run_proc("install", cmd, timeout)
        if rc != 0:
            raise PhaseError(f"pip install exited with {rc} (see gpu_check.log)")
        self.result["install"] = {"target": str(self.site), "wheels": [w.name for w in wheels]}
        self.choose_speclocal()  # the target folder exists now: put it on the path

    def phase_inspect(self, timeout: float) -> None:
        info = self.worker("inspect", {"repo": str(REPO)}, timeout)
        self.result["llama"] = info
        offload = bool(info.get("supports_gpu_offload"))
        self.n_gpu_layers = tree_devices().resolve_gpu_layers(self.ngl, offload)
        self.result["ngl"] = self.ngl
        self.result["n_gpu_layers"] = self.n_gpu_layers
        if self.gpu_seen():
            if not offload:
                self.gpu_fail("this llama.cpp is a CPU-only build (llama_supports_gpu_offload() is false in "
                              f"{info.get('llama_cpp_file')}): nothing would run on the GPU")
            if not info.get("gpu_devices"):
                self.gpu_fail("llama.cpp registered no GPU device (devices: "
                              + ", ".join(d["name"] for d in info.get("devices", [])) + ")")
            if self.n_gpu_layers == 0:
                self.gpu_fail(f"-ngl {self.ngl} offloads no layer")
        self.say(f"inspect: llama-cpp-python {info['llama_cpp_version']} from {info['llama_cpp_file']}, "
                 f"backend {info['backend']}, devices: "
                 + ", ".join(f"{d['name']} ({d['description']})" for d in info["devices"])
                 + f"; -ngl {self.ngl}")

    def find_vocab(self) -> Path | str:
        if self.args.vocab != "auto":
            return self.args.vocab if self.args.vocab == "synthetic" else Path(self.args.vocab).resolve()
        if self.vocab is not None and self.vocab.is_file():
            return self.vocab
        if self.bundle is not None:  # --skip-build: take the vocabulary out of the bundled sdist
            manifest = json.loads((self.bundle / "manifest.json").read_text())
            version = manifest["llama_cpp_python"]
            dest = self.work / "vocab"
            with tarfile.open(self.bundle / SDIST_NAME.format(version=version)) as tar:
                member = tar.getmember(f"llama_cpp_python-{version}/{VOCAB_MEMBER}")
                _extract(tar, dest, [member])
            return dest / member.name
        if self.args.shapes == "tiny":
            return "synthetic"
        raise PhaseError("no Qwen2 vocabulary: give --bundle (its sdist has models/ggml-vocab-qwen2.gguf) or --vocab")

    def phase_models(self, timeout: float) -> None:
        vocab = self.find_vocab()
        payload = {"shapes": SHAPES[self.args.shapes], "arch": ARCH, "vocab": str(vocab), "quant": self.args.quant,
                   "dir": str(self.work / "models"), "threads": os.cpu_count() or 1, "n_gpu_layers": self.n_gpu_layers,
                   "check_threads": self.args.threads or os.cpu_count() or 1,
                   "seed": self.args.seed, "keep_f16": self.args.keep_f16}
        info = self.worker("models", payload, timeout)
        self.result["models"] = info
        self.models = {role: Path(m["path"]) for role, m in info["models"].items()}
        if self.gpu_seen():
            for role, m in info["models"].items():
                off = re.match(r"(\d+)/", m["check"].get("offloaded") or "")
                if not off or int(off.group(1)) == 0:
                    self.gpu_fail(f"llama.cpp offloaded no layer of the {role} model to it "
                                  f"({m['check'].get('offloaded') or 'no offload line in its log'})")
        bad = [role for role, m in info["models"].items() if not m["check"]["finite"]]
        if bad:
            raise PhaseError(f"non-finite logits from the random {', '.join(bad)} model")

    def model_args(self, draft: str) -> list[str]:
        main = str(self.models["main"])
        threads = ["-t", str(self.args.threads)] if self.args.threads else []
        return ["-m", main, "-md", main if draft == "self" else str(self.models["draft"]), "-ngl", str(self.ngl),
                "-c", str(N_CTX), *threads]

    def phase_profile(self, draft: str, timeout: float) -> None:
        key = "profile" if draft == "draft" else "profile_self"
        report = self.speclocal(key, ["profile", "--json", "--refresh", *self.model_args(draft)], timeout)
        self.result[key] = report
        c = report["curve"]
        v = c["verify"]
        self.say(f"{key}: t_single {c['t_single'] * 1000:.2f} ms, c {c['draft_cost']:.3f}, "
                 f"V(2) {v[1]:.2f}, V(4) {v[3]:.2f}, V({len(v)}) {v[-1]:.2f}")

    def phase_run(self, name: str, draft: str, k: int, timeout: float, extra: tuple[str, ...] = ()) -> None:
        n = N_PREDICT[self.args.shapes]
        report = self.speclocal(f"run:{name}", ["run", "--json", "--mode", "compare", "--against", "spec", "--raw",
                                                "-n", str(n), "--draft-max", str(k), *extra, *self.model_args(draft),
                                                PROMPT], timeout)
        runs = [_slim(r) for r in report["runs"]]
        rec = {"draft": draft, "k": k, "n_predict": n, "n_prompt": report.get("n_prompt"), "plain": runs[0],
               "flags": list(extra), "compute": report.get("compute"),
               "spec": runs[1] if len(runs) > 1 else None, "measured_speedup": report.get("speedup"),
               "equivalence": report.get("equivalence")}
        self.result["runs"][name] = rec
        spec = rec["spec"] or {}
        self.say(f"run:{name}: plain {runs[0]['decode_tps']:.1f} t/s, spec {spec.get('decode_tps', 0):.1f} t/s, "
                 f"acceptance {spec.get('acceptance') or 0:.2f}, speedup {rec['measured_speedup'] or 0:.3f}x")

    def phase_synthetic(self, timeout: float) -> None:
        """Synthetic acceptance 0.5 / 0.8 / 0.9 at k = 3 / 8: `speclocal profile --sweep`, the engine's
        benchmark-only drafter (the main model's own greedy continuation, right at the set rate), each step
        paying the real draft model's decode time; measured speedup against the cost model's prediction."""
        n = N_PREDICT[self.args.shapes]
        report = self.speclocal("synthetic", ["profile", "--json", "--sweep", "--sweep-charge", "--sweep-rates",
                                              "0.5,0.8,0.9", "--sweep-k", "3,8", "--sweep-n", str(n),
                                              *self.model_args("draft")], timeout)
        self.result["synthetic"] = report["sweep"]
        self.say(f"synthetic: median |predicted - measured| {report['sweep']['median_abs_error']:.1%} over "
                 f"{len(report['sweep']['rows'])} cells")

    def phase_predict(self, timeout: float) -> None:
        payload = {"runs": self.result["runs"], "profile": self.result.get("profile"),
                   "profile_self": self.result.get("profile_self")}
        pred = self.worker("predict", payload, timeout)
        for name, p in pred["runs"].items():
            self.result["runs"][name]["prediction"] = p
        self.result["prediction_summary"] = pred["summary"]

    # ---- the whole check -----------------------------------------------------------------------
    def run(self) -> int:
        a = self.args
        try:
            self.phase("environment", self.phase_environment, always=True)  # seconds, and it says where we ran
            if a.bundle and self.result["phases"]["environment"]["status"] != "ok":
                return self.finish()
            if not a.skip_build:  # before minutes go to the build: is every tool it needs here?
                self.phase("preflight", self.phase_preflight, always=True)
                if self.result["phases"]["preflight"]["status"] != "ok":
                    for line in self.result.get("preflight", {}).get("missing") or [
                            self.result["phases"]["preflight"].get("error", "preflight failed")]:
                        print(f"gpu_check: preflight: {line}", file=sys.stderr, flush=True)
                    self.result["fatal"] = "preflight: " + self.result["phases"]["preflight"].get("error", "")
                    self.finish()
                    return 2
            n_runs = len(RUNS)
            after_build = self.later("install", "inspect", "models", "profile", "profile", "predict", runs=n_runs)
            if a.skip_build:
                self.result["phases"]["build"] = {"status": "skipped", "reason": "--skip-build"}
                reused = (self.site / "llama_cpp").is_dir()
                self.result["llama_from"] = "previous build in --work" if reused else "this Python's environment"
            else:  # main() saw to a --bundle
                self.phase("build", self.phase_build, needs=("environment",), reserve=after_build)
                self.result["llama_from"] = "this build"
            try:
                self.choose_speclocal()
            except PhaseError as e:
                self.result["fatal"] = str(e)
                self.say(f"error: {e}")
                return self.finish()
            if self.bundle is not None:
                self.phase("install", self.phase_install, needs=() if a.skip_build else ("build",),
                           reserve=after_build - self.est["install"])
            else:
                self.result["phases"]["install"] = {"status": "skipped", "reason": "no --bundle: this environment's "
                                                    "packages and the tree's app/"}
            inst = () if self.bundle is None else ("install",)
            self.phase("inspect", self.phase_inspect, needs=inst, reserve=self.later("models", "profile", "profile",
                                                                                     "predict", runs=n_runs))
            self.phase("models", self.phase_models, needs=("inspect",),
                       reserve=self.later("profile", "profile", "predict", runs=n_runs))
            left = n_runs
            self.phase("profile", lambda t: self.phase_profile("draft", t), needs=("models",),
                       reserve=self.later("profile", "predict", runs=left))
            self.phase("profile_self", lambda t: self.phase_profile("self", t), needs=("models",),
                       reserve=self.later("predict", runs=left), cap_key="profile")
            for name, draft, k, extra in RUNS:
                left -= 1
                self.phase(f"run:{name}", lambda t, n=name, d=draft, kk=k, x=extra: self.phase_run(n, d, kk, t, x),
                           needs=("models",), reserve=self.later("predict", runs=left), cap_key="run")
            if self.result["runs"]:  # before the sweep: measured against predicted is worth more
                self.phase("predict", self.phase_predict)
            self.phase("synthetic", self.phase_synthetic, needs=("models",), cap_key="run")
        except GpuNotUsed as e:
            self.result["fatal"] = self.result["gpu_not_used"] = str(e)
            self.finish()
            print(f"gpu_check: FAILED: {e}", file=sys.stderr, flush=True)
            return 1
        except KeyboardInterrupt:
            self.result["interrupted"] = True
            self.say("interrupted: writing what there is")
        return self.finish()

    def finish(self) -> int:
        statuses = {n: p.get("status") for n, p in self.result["phases"].items()}
        bad = [n for n, s in statuses.items() if s in ("failed", "timeout", "running")
               or (s == "skipped" and not str(self.result["phases"][n].get("reason", "")).startswith(("--skip", "no --bundle")))]
        ok = not bad and not self.result.get("interrupted") and not self.result.get("fatal")
        self.result["status"] = "ok" if ok else "failed" if self.result.get("gpu_not_used") else "partial"
        self.result["incomplete_phases"] = bad
        self.result["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        self.save()
        try:
            md = summary_md(self.result)
        except Exception as e:  # noqa: BLE001 - a bug in the summary must not cost the run its status
            self.log(traceback.format_exc())
            md = (f"# speclocal GPU check: {self.result['status']}\n\nThe summary failed ({type(e).__name__}: {e}); "
                  "gpu_check.json holds every number.\n")
        (self.out / "gpu_check.md").write_text(md)
        self.say(f"done: {self.result['status']}" + (f" (incomplete: {', '.join(bad)})" if bad else "")
                 + f"; {self.out / 'gpu_check.json'}, {self.out / 'gpu_check.md'}")
        return 0 if self.result["status"] == "ok" else 1


def _cap_file(path: Path, limit: int = 8 << 20, head: int = 1 << 20) -> None:
    """Keep a log under `limit` bytes (its first MiB and its end): the device tool returns files up to 16 MiB."""
    size = path.stat().st_size
    if size <= limit:
        return
    with path.open("rb") as f:
        first = f.read(head)
        f.seek(size - (limit - head))
        last = f.read()
    path.write_bytes(first + f"\n[... {size - len(first) - len(last):,} bytes cut ...]\n".encode() + last)


def _slim(run: dict) -> dict:
    """A generation result without its token lists and text (kept: the first 120 characters, and a hash of the
    tokens, so runs can be compared token for token)."""
    out = {k: v for k, v in run.items() if k not in ("tokens", "from_draft", "text")}
    out["text_head"] = (run.get("text") or "")[:120]
    out["tokens_sha1"] = hashlib.sha1(json.dumps(run.get("tokens")).encode()).hexdigest()
    return out


def _extract(tar: tarfile.TarFile, dest: Path, members=None) -> None:
    try:
        tar.extractall(dest, members=members, filter="data")
    except TypeError:  # Python without extraction filters
        tar.extractall(dest, members=members)


def _first_line(cmd: list[str]) -> str | None:
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = [x for x in r.stdout.strip().splitlines() if x.strip()]
    return lines[0] if r.returncode == 0 and lines else None


def _nvcc_version(nvcc: str) -> str | None:
    try:
        r = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"release ([\d.]+), (V[\d.]+)", r.stdout)
    return f"{m.group(1)} ({m.group(2)})" if m else None


def _find_nvcc() -> str | None:
    found = shutil.which("nvcc")
    if found:
        return found
    for p in ("/usr/local/cuda/bin/nvcc", "/opt/cuda/bin/nvcc"):
        if os.access(p, os.X_OK):
            return p
    return None


def _nvcc_root(nvcc: str) -> Path | None:
    """The toolkit folder of nvcc, also through a wrapper script (`exec /usr/local/cuda-13.0/bin/nvcc "$@"`)."""
    path = Path(nvcc).resolve()
    try:
        head = path.read_bytes()[:400]
    except OSError:
        return None
    if head.startswith(b"#!"):
        m = re.search(rb"exec\s+[\"']?(/\S+?/bin/nvcc)\b", head)
        if not m:
            return None
        path = Path(m.group(1).decode()).resolve()
    return path.parent.parent


def cuda_fixups(work: Path, nvcc: str | None, site_dirs: list[str] | None = None,
                driver_dirs: tuple[str, ...] = ("/usr/local/nvidia/lib64", "/usr/local/nvidia/lib",
                                                "/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/lib/x86_64-linux-gnu"),
                toolkits: list[str] | None = None) -> dict:
    """What CMake's FindCUDAToolkit needs for ggml-cuda (cuBLAS, cublasLt, cudart, the driver library) where
    a CUDA image assembled from pip wheels lacks it in the toolkit folder: take cuBLAS from the nvidia-*
    wheels PyTorch brings (site-packages/nvidia/cu13/lib holds only libcublas.so.13, no libcublas.so), the
    driver from its mount, link each under its plain name in WORK/cuda-extra/lib, and hand CMake that folder
    (CMAKE_LIBRARY_PATH) and the wheels' headers (-I). Without a driver library: GGML_CUDA_NO_VMM (no link
    to libcuda). Also the folders to put on LD_LIBRARY_PATH so the built library finds cuBLAS at run time."""
    import site

    roots = []
    if toolkits is None:
        toolkits = [os.environ.get("CUDA_PATH"), os.environ.get("CUDA_HOME"), "/usr/local/cuda",
                    str(_nvcc_root(nvcc) or "") if nvcc else None]
    for r in toolkits:
        if r and Path(r).is_dir() and Path(r).resolve() not in roots:
            roots.append(Path(r).resolve())
    tk_lib = [d for r in roots for d in (r / "lib64", r / "lib", r / "targets/x86_64-linux/lib",
                                          r / "lib64/stubs", r / "targets/x86_64-linux/lib/stubs") if d.is_dir()]
    tk_inc = [d for r in roots for d in (r / "include", r / "targets/x86_64-linux/include") if d.is_dir()]
    if site_dirs is None:
        site_dirs = list(dict.fromkeys([*sys.path, *site.getsitepackages()]))
    wheel_lib = sorted({d for s in site_dirs if s and Path(s).is_dir() for d in Path(s).glob("nvidia/*/lib")})
    wheel_inc = sorted({d for s in site_dirs if s and Path(s).is_dir() for d in Path(s).glob("nvidia/*/include")})
    extra = work / "cuda-extra" / "lib"
    out: dict = {"toolkit": [str(r) for r in roots], "found": {}, "cmake": [], "ld_library_path": [], "notes": []}

    def runtime_dir(name: str, d: Path) -> None:
        # the loader must find the real library at run time; never a stub (stubs/libcuda.so only links)
        if name != "cuda" and d.name != "stubs" and str(d) not in out["ld_library_path"]:
            out["ld_library_path"].append(str(d))

    def find(name: str, plain: list[Path], versioned: list[Path]) -> None:
        for d in plain:
            if (d / f"lib{name}.so").exists():
                out["found"][name] = str(d / f"lib{name}.so")
                runtime_dir(name, d)
                return
        for d in versioned:
            hits = sorted(d.glob(f"lib{name}.so*"))
            if hits:
                extra.mkdir(parents=True, exist_ok=True)
                link = extra / f"lib{name}.so"
                if link.is_symlink() or link.exists():
                    link.unlink()
                link.symlink_to(hits[0])
                out["found"][name] = f"{hits[0]} (linked as {link})"
                runtime_dir(name, d)
                return
        out["found"][name] = None

    for lib in ("cudart", "cublas", "cublasLt"):
        find(lib, tk_lib, tk_lib + wheel_lib)
    find("cuda", tk_lib + [Path(d) for d in driver_dirs if Path(d).is_dir()],
         [Path(d) for d in driver_dirs if Path(d).is_dir()] + tk_lib)
    if extra.is_dir():
        out["cmake"].append(f"-DCMAKE_LIBRARY_PATH={extra}")
    if not any((d / "cublas_v2.h").is_file() for d in tk_inc):
        inc = next((d for d in wheel_inc if (d / "cublas_v2.h").is_file()), None)
        if inc is not None:
            out["cmake"] += [f"-DCMAKE_CUDA_FLAGS=-I{inc}", f"-DCMAKE_CXX_FLAGS=-I{inc}"]
            out["notes"].append(f"cublas_v2.h from {inc}")
        else:
            out["notes"].append("cublas_v2.h found nowhere: the CUDA build will fail")
    if out["found"]["cuda"] is None:
        out["cmake"].append("-DGGML_CUDA_NO_VMM=ON")
        out["notes"].append("no driver library (libcuda.so) to link: GGML_CUDA_NO_VMM=ON")
    for d in wheel_lib:  # run time: the wheels' cuBLAS next to what torch uses
        if any(d.glob("libcublas.so*")) and str(d) not in out["ld_library_path"]:
            out["ld_library_path"].append(str(d))
    return out


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _gpus_listed() -> list[str]:
    """`nvidia-smi -L`'s GPU lines; none where the binary is missing, fails or lists nothing."""
    if not shutil.which("nvidia-smi"):
        return []
    try:
        r = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return []
    if r.returncode != 0:
        return []
    return [x.strip() for x in r.stdout.splitlines() if x.strip().startswith("GPU ")]


def tree_devices():
    """speclocal.models.devices from this tree's app/: what -ngl means (resolve_gpu_layers) as speclocal reads
    it. Stdlib only at import (llama_cpp only when asked whether the build can offload), so the orchestrator
    uses it before anything is installed."""
    app = str(REPO / "app")
    if app not in sys.path:
        sys.path.insert(0, app)
    from speclocal.models import devices

    return devices


def _version_tuple(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v.split("+")[0])[:3])


def preflight(bundle: Path | None, gpu: bool) -> tuple[list[str], dict]:
    """What the build needs, each checked in well under a second: (one line per missing piece, found)."""
    import importlib.metadata
    import tomllib

    problems: list[str] = []
    found: dict = {}
    for tool, what in (("cmake", "CMake (llama.cpp's build)"), ("ninja", "Ninja (the build's generator)")):
        found[tool] = shutil.which(tool)
        if not found[tool]:
            problems.append(f"{tool}: not on PATH; {what} is needed")
    cxx = os.environ.get("CXX")
    found["cxx"] = shutil.which(cxx) if cxx else next(filter(None, map(shutil.which, ("c++", "g++", "clang++"))), None)
    if not found["cxx"]:
        problems.append(f"C++ compiler: {'CXX=' + cxx + ' is not' if cxx else 'no c++, g++ or clang++'} on PATH")
    if gpu:
        found["nvcc"] = _find_nvcc()
        if not found["nvcc"]:
            problems.append("nvcc: nvidia-smi lists a GPU but CUDA's compiler is neither on PATH nor in "
                            "/usr/local/cuda/bin: the build would be CPU-only")
    # the build backend: pip wheel --no-build-isolation uses this Python's, at the version the sdist asks for
    want = None
    try:
        manifest = json.loads((bundle / "manifest.json").read_text())
        version = manifest["llama_cpp_python"]
        with tarfile.open(bundle / SDIST_NAME.format(version=version)) as tar:
            f = tar.extractfile(f"llama_cpp_python-{version}/pyproject.toml")
            bs = tomllib.loads(f.read().decode())["build-system"]
        found["build_backend"] = bs.get("build-backend")
        want = next((r for r in bs.get("requires", []) if r.lower().startswith("scikit-build-core")), None)
    except (OSError, KeyError, ValueError, TypeError, AttributeError, tarfile.TarError) as e:
        problems.append(f"build backend: cannot read the bundled sdist's pyproject.toml ({type(e).__name__}: {e})")
    try:
        have = importlib.metadata.version("scikit_build_core")
    except importlib.metadata.PackageNotFoundError:
        have = None
    found["scikit_build_core"] = have
    m = re.search(r">=\s*([\d.]+)", want or "")
    if have is None:
        problems.append(f"build backend: scikit-build-core is not installed in {sys.executable}"
                        + (f" (the sdist asks for {want})" if want else ""))
    elif m and _version_tuple(have) < _version_tuple(m.group(1)):
        problems.append(f"build backend: scikit-build-core {have} here, the sdist asks for {want}")
    return problems, found


def _nvidia_smi() -> dict | None:
    if not shutil.which("nvidia-smi"):
        return None
    q = "name,driver_version,memory.total,memory.used,compute_cap,clocks.max.sm,clocks.max.mem"
    try:
        r = subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader,nounits"],
                           capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError) as e:
        return {"error": str(e)}
    if r.returncode != 0:
        return {"error": (r.stderr or r.stdout).strip()[:300]}
    keys = q.split(",")
    gpus = [dict(zip(keys, (x.strip() for x in line.split(",")))) for line in r.stdout.strip().splitlines() if line]
    return {"gpus": gpus}


# =====================================================================================================
# The summary
# =====================================================================================================

def _f(x, fmt: str = ".2f", suffix: str = "") -> str:
    return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:{fmt}}{suffix}"


def _pct(x, fmt: str = "+.1f") -> str:
    """A fraction as a percentage; "-" where there is none (e.g. a sweep cell with no token before parting)."""
    return _f(None if x is None else 100 * x, fmt, " %")


def _params(n: int) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e8 else f"{n / 1e6:.2f} M"


def _ratio(a: dict, b: dict) -> float | None:
    return a["decode_tps"] / b["decode_tps"] if a.get("decode_tps") and b.get("decode_tps") else None


def summary_md(r: dict) -> str:
    env = r.get("environment", {})
    llama = r.get("llama", {})
    smi = (env.get("nvidia_smi") or {}).get("gpus") or []
    device = ", ".join(g.get("name", "?") for g in smi) or "no NVIDIA GPU"
    lines = [f"# speclocal GPU check: {r['status']}", ""]
    if r.get("fatal"):
        lines += [f"Stopped: {r['fatal']}", ""]
    lines.append(f"{r.get('started_at', '')}; {device}; {env.get('cpu_count')} CPUs ({env.get('cpu')}); "
                 f"Python {env.get('python')}; shapes `{r['shapes']}`; {r.get('elapsed_s')} s of a "
                 f"{r['time_budget_s']} s budget.")
    b = r.get("build")
    if b:
        lines.append(f"llama-cpp-python {b.get('version')} built for {b['backend']} in {_f(b.get('seconds'), '.0f', ' s')} "
                     f"on {b['jobs']} jobs: `{' '.join(b['cmake_args'])}`.")
    else:
        lines.append(f"llama-cpp-python: {r.get('llama_from', '-')} (not built by this run).")
    if llama:
        offl = (r.get("models", {}).get("models", {}).get("main", {}).get("check", {}) or {}).get("offloaded")
        devices = ", ".join(f"{d['name']}: {d['description']}" for d in llama.get("devices", []))
        lines.append(f"Backend **{llama.get('backend')}** ({devices}); "
                     f"-ngl {r.get('ngl', r.get('n_gpu_layers'))} (n_gpu_layers {r.get('n_gpu_layers')})"
                     + (f", main model: {offl}" if offl else "") + ".")
    src = r.get("speclocal_source")
    if src:
        lines.append(f"speclocal from the {src['from']} ({src['reason']}).")
    m = r.get("models")
    if m:
        desc = []
        for role, x in m["models"].items():
            s = x["shape"]
            desc.append(f"{role}: {s['label']} ({s['n_layer']} layers, n_embd {s['n_embd']}, n_ff {s['n_ff']}, "
                        f"{s['n_head']}/{s['n_head_kv']} heads, {_params(x['n_params'])} params, "
                        f"{x['quant_bytes'] / 2**20:.1f} MiB {x['quant']})")
        lines.append(f"Models: random weights, vocabulary {m['vocab']['source']} ({m['vocab']['n_vocab']:,} tokens); "
                     + "; ".join(desc) + ".")
    lines.append("")
    for key, label in (("profile", "main + draft"), ("profile_self", "main + main (self-draft)")):
        p = r.get(key)
        if p:
            c = p["curve"]
            v = c["verify"]
            lines.append(f"- profile, {label}: single-token decode {c['t_single'] * 1000:.2f} ms, c = {c['draft_cost']:.3f}, "
                         f"V(2) {v[1]:.2f}, V(4) {v[3]:.2f}, V(9) {v[8]:.2f}, V({len(v)}) {v[-1]:.2f}")
    runs = r.get("runs") or {}
    if runs:
        lines += ["", "| run | draft | k | acceptance | tokens/pass | plain t/s | spec t/s | measured | predicted | error |",
                  "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|"]
        for name, x in runs.items():
            s = x.get("spec") or {}
            p = x.get("prediction") or {}
            lines.append(f"| {name} | {x['draft']} | {x['k']} | {_f(s.get('acceptance'))} | {_f(s.get('tokens_per_pass'))} "
                         f"| {_f(x['plain'].get('decode_tps'), '.1f')} | {_f(s.get('decode_tps'), '.1f')} "
                         f"| {_f(x.get('measured_speedup'), '.3f', 'x')} | {_f(p.get('predicted_speedup'), '.3f', 'x')} "
                         f"| {_pct(p.get('error'))} |")
        lines.append("\nThe draft model's random weights are not main's: its acceptance is ~0 (its runs measure "
                     "what drafting costs); self-draft's is ~1.")
        dev, host = runs.get("self-k8") or {}, runs.get("self-k8-host") or {}
        if dev.get("spec") and host.get("spec"):
            lines.append(f"\nSampling on the device (self-k8, computing on {dev.get('compute')}) against each row's "
                         f"logits copied to the host (self-k8-host, --no-backend-sampling): plain "
                         f"{_f(_ratio(dev['plain'], host['plain']), '.3f', 'x')}, spec "
                         f"{_f(_ratio(dev['spec'], host['spec']), '.3f', 'x')} the host path's decode t/s; "
                         f"the same tokens: {dev['spec'].get('tokens_sha1') == host['spec'].get('tokens_sha1')}.")
        ps = r.get("prediction_summary")
        if ps:
            lines.append("")
            lines.append(f"Predicted = Σ E(a, d) / Σ (d·c + V(d+1)) over the run's main passes (d = k, fewer only "
                         f"where -n left less room), a = the i.i.d. acceptance that explains the run's accepted drafts, "
                         f"c and V from the matching profile; error = predicted / measured - 1; median |error| "
                         f"{_pct(ps.get('median_abs_error'), '.1f')}.")
    sy = r.get("synthetic")
    if sy:
        lines += ["", "Synthetic acceptance (`speclocal profile --sweep --sweep-charge`: the main model's own "
                  "continuation, right at the set rate, each step paying the real draft model's time):", "",
                  "| k | set rate | measured a | measured | predicted | error | tokens |", "|--:|--:|--:|--:|--:|--:|--:|"]
        for x in sy["rows"]:
            lines.append(f"| {x['k']} | {x['rate']:.2f} | {_f(x.get('acceptance_mle'))} | "
                         f"{_f(x['measured'], '.3f', 'x')} | {_f(x['predicted'], '.3f', 'x')} | "
                         f"{_pct(x['error'])} | {x.get('tokens', '-')} |")
        lines.append(f"\nMedian |error| {_pct(sy['median_abs_error'], '.1f')}; tokens: the synthetic run's tokens "
                     "before its greedy output parted from plain's (a near tie), which the cell measures.")
    lines += ["", "| phase | status | seconds | expected on 16 cores, full shapes | note |", "|---|---|--:|--:|---|"]
    for name, p in r["phases"].items():
        note = p.get("error") or p.get("reason") or ""
        lines.append(f"| {name} | {p.get('status')} | {_f(p.get('seconds'), '.1f')} | "
                     f"{EXPECTED_16CORE.get(name.split(':')[0], '-')} | {note.replace('|', '/')[:200]} |")
    lines.append("")
    return "\n".join(lines)


# =====================================================================================================
# Workers: run in the prepared environment (llama_cpp, gguf, numpy, speclocal importable)
# =====================================================================================================

def progress(msg: str) -> None:
    print(f"@@ {msg}", flush=True)


def worker_inspect(payload: dict) -> dict:
    import importlib.metadata as md

    import llama_cpp as ll

    ll.llama_backend_init()
    lib_dir = Path(ll.__file__).parent / "lib"
    devices = _devices(lib_dir)
    gpu = [d for d in devices if d["type"] in ("GPU", "IGPU")]
    backend = "+".join(sorted({d["backend"] for d in gpu})) if gpu else "CPU"
    import speclocal

    pkgs = {}
    for name in ("llama_cpp_python", "speclocal", "gguf", "numpy", "psutil", "platformdirs", "textual", "rich",
                 "jinja2", "diskcache", "huggingface_hub", "matplotlib", "tqdm", "typing_extensions", "pyyaml"):
        try:
            pkgs[name] = md.version(name)
        except md.PackageNotFoundError:
            pkgs[name] = None
    return {
        "llama_cpp_version": ll.__version__, "llama_cpp_file": str(Path(ll.__file__).parent),
        "speclocal_version": speclocal.__version__, "speclocal_file": str(Path(speclocal.__file__).parent),
        "system_info": ll.llama_print_system_info().decode("utf-8", "replace").strip(),
        "supports_gpu_offload": bool(ll.llama_supports_gpu_offload()), "max_devices": int(ll.llama_max_devices()),
        "devices": devices, "gpu_devices": len(gpu), "backend": backend, "libs": sorted(p.name for p in lib_dir.glob("*.so")),
        "packages": pkgs, "unmet_requirements": _unmet(Path(payload["repo"])),
    }


def _devices(lib_dir: Path) -> list[dict]:
    """ggml's device registry (llama-cpp-python binds none of it): name, description, type, memory."""
    base = ctypes.CDLL(str(lib_dir / "libggml-base.so"))
    ggml = ctypes.CDLL(str(lib_dir / "libggml.so"))
    vp, cp, sz = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t
    ggml.ggml_backend_dev_count.restype = sz
    ggml.ggml_backend_dev_get.restype, ggml.ggml_backend_dev_get.argtypes = vp, [sz]
    for fn in ("ggml_backend_dev_name", "ggml_backend_dev_description"):
        getattr(base, fn).restype, getattr(base, fn).argtypes = cp, [vp]
    base.ggml_backend_dev_type.restype, base.ggml_backend_dev_type.argtypes = ctypes.c_int, [vp]
    base.ggml_backend_dev_memory.restype = None
    base.ggml_backend_dev_memory.argtypes = [vp, ctypes.POINTER(sz), ctypes.POINTER(sz)]
    base.ggml_backend_dev_backend_reg.restype, base.ggml_backend_dev_backend_reg.argtypes = vp, [vp]
    base.ggml_backend_reg_name.restype, base.ggml_backend_reg_name.argtypes = cp, [vp]
    types = {0: "CPU", 1: "GPU", 2: "IGPU", 3: "ACCEL"}
    out = []
    for i in range(ggml.ggml_backend_dev_count()):
        dev = ggml.ggml_backend_dev_get(i)
        free, total = sz(0), sz(0)
        base.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        reg = base.ggml_backend_dev_backend_reg(dev)
        out.append({"name": base.ggml_backend_dev_name(dev).decode(),
                    "description": base.ggml_backend_dev_description(dev).decode(),
                    "type": types.get(base.ggml_backend_dev_type(dev), "?"),
                    "backend": base.ggml_backend_reg_name(reg).decode() if reg else "?",
                    "memory_free": free.value, "memory_total": total.value})
    return out


def _unmet(repo: Path) -> list[str] | None:
    """speclocal's requirements (its installed metadata, else pyproject.toml) that this environment misses."""
    try:
        import importlib.metadata as md

        from packaging.requirements import Requirement
    except ImportError:
        return None
    try:
        reqs = md.requires("speclocal") or []
    except md.PackageNotFoundError:
        import tomllib

        reqs = tomllib.loads((repo / "pyproject.toml").read_text())["project"]["dependencies"]
    unmet = []
    for s in reqs:
        r = Requirement(s)
        if r.marker and not r.marker.evaluate({"extra": ""}):
            continue
        try:
            v = md.version(r.name)
        except md.PackageNotFoundError:
            unmet.append(f"{r} (missing)")
            continue
        if r.specifier and not r.specifier.contains(v, prereleases=True):
            unmet.append(f"{r} (found {v})")
    return unmet


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map (the BPE vocabularies' byte tokens)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def write_synthetic_vocab(path: Path) -> None:
    """A small byte-level BPE vocabulary in the layout of ggml-vocab-qwen2.gguf (for the CPU test, which has no
    real one without a download): 256 byte tokens, a few merges, ChatML's special tokens."""
    import gguf

    b2u = _bytes_to_unicode()
    tokens = [b2u[b] for b in range(256)]
    sp = b2u[ord(" ")]
    merges = [f"{sp} {c}" for c in "tiaso"] + ["e r", "i n", "o n"]
    tokens += [m.replace(" ", "") for m in merges]
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    types = [1] * len(tokens) + [3] * len(specials)
    tokens += specials
    w = gguf.GGUFWriter(str(path), "qwen2")
    w.add_string("tokenizer.ggml.model", "gpt2")
    w.add_string("tokenizer.ggml.pre", "qwen2")
    w.add_array("tokenizer.ggml.tokens", tokens)
    w.add_array("tokenizer.ggml.token_type", types)
    w.add_array("tokenizer.ggml.merges", merges)
    eot = tokens.index("<|endoftext|>")
    w.add_uint32("tokenizer.ggml.eos_token_id", eot)
    w.add_uint32("tokenizer.ggml.padding_token_id", eot)
    w.add_uint32("tokenizer.ggml.bos_token_id", eot)
    w.add_string("tokenizer.chat_template", "{% for m in messages %}{{'<|im_start|>' + m['role'] + '\n' + m['content'] "
                                            "+ '<|im_end|>\n'}}{% endfor %}{% if add_generation_prompt %}"
                                            "{{'<|im_start|>assistant\n'}}{% endif %}")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()


def read_tokenizer(path: Path) -> dict:
    """Every tokenizer.* key of a GGUF file, arrays in full: {key: (value, type, array element type)}."""
    from speclocal.models.gguf_info import read_metadata

    out = read_metadata(path, "tokenizer.")
    if "tokenizer.ggml.tokens" not in out:
        raise PhaseError(f"{path} has no tokenizer.ggml.tokens")
    return out


def tensor_types(path: Path) -> dict[str, float]:
    """MiB of tensor data per ggml type of a GGUF file."""
    from speclocal.models.gguf_info import read_gguf

    return {k: round(v / 2**20, 1) for k, v in read_gguf(path).tensor_types.items()}


def _tensor_plan(s: dict, n_vocab: int, tied: bool) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, numpy shape (rows = output dim), init) of a Qwen2 model, in llama.cpp's tensor names."""
    e, hd = s["n_embd"], s["n_embd"] // s["n_head"]
    kv = s["n_head_kv"] * hd
    plan = [("token_embd.weight", (n_vocab, e), "embd"), ("output_norm.weight", (e,), "ones")]
    if not tied:
        plan.append(("output.weight", (n_vocab, e), "output"))
    for i in range(s["n_layer"]):
        b = f"blk.{i}."
        plan += [(b + "attn_norm.weight", (e,), "ones"),
                 (b + "attn_q.weight", (e, e), "normal"), (b + "attn_q.bias", (e,), "zeros"),
                 (b + "attn_k.weight", (kv, e), "normal"), (b + "attn_k.bias", (kv,), "zeros"),
                 (b + "attn_v.weight", (kv, e), "normal"), (b + "attn_v.bias", (kv,), "zeros"),
                 (b + "attn_output.weight", (e, e), "branch"), (b + "ffn_norm.weight", (e,), "ones"),
                 (b + "ffn_gate.weight", (s["n_ff"], e), "normal"), (b + "ffn_up.weight", (s["n_ff"], e), "normal"),
                 (b + "ffn_down.weight", (e, s["n_ff"]), "branch")]
    return plan


def _random_f16(shape: tuple[int, ...], seed, threads: int, std: float):
    """Normal(0, std) as float16, filled in parallel (numpy's generators release the GIL)."""
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    size = math.prod(shape)
    out = np.empty(size, dtype=np.float16)
    chunk = 1 << 22
    n_chunks = (size + chunk - 1) // chunk
    seeds = seed.spawn(n_chunks)

    def fill(i: int) -> None:
        lo, hi = i * chunk, min(size, (i + 1) * chunk)
        tmp = np.random.default_rng(seeds[i]).standard_normal(hi - lo, dtype=np.float32)
        tmp *= std
        out[lo:hi] = tmp

    with ThreadPoolExecutor(max_workers=max(1, threads)) as ex:
        list(ex.map(fill, range(n_chunks)))
    return out.reshape(shape)


def write_model(path: Path, s: dict, arch: dict, tok: dict, seed, threads: int) -> int:
    """A random-weight Qwen2 GGUF (f16 matrices, f32 norms and biases), written tensor by tensor; returns the
    parameter count. Conditioned as INIT_STD says; the output rows of the special tokens are zero, so their
    logit (0) never wins greedily: generations run to -n instead of stopping at a random EOS."""
    import gguf
    import numpy as np

    tokens = tok["tokenizer.ggml.tokens"][0]
    n_vocab = len(tokens)
    types = tok.get("tokenizer.ggml.token_type", ([1] * n_vocab,))[0]
    special = np.array([i for i, t in enumerate(types) if t != 1], dtype=np.int64)
    plain = np.array([i for i, t in enumerate(types) if t == 1], dtype=np.int64)
    w = gguf.GGUFWriter(str(path), "qwen2")
    w.add_name(s["label"] + " (random weights)")
    w.add_context_length(arch["context_length"])
    w.add_embedding_length(s["n_embd"])
    w.add_block_count(s["n_layer"])
    w.add_feed_forward_length(s["n_ff"])
    w.add_head_count(s["n_head"])
    w.add_head_count_kv(s["n_head_kv"])
    w.add_rope_freq_base(arch["rope_freq_base"])
    w.add_layer_norm_rms_eps(arch["rms_eps"])
    w.add_file_type(1)  # LLAMA_FTYPE_MOSTLY_F16
    kv = dict(tok)
    if "<|im_end|>" in tokens:  # as in the default pair's GGUFs: EOS <|im_end|>, no BOS added
        kv["tokenizer.ggml.eos_token_id"] = (tokens.index("<|im_end|>"), gguf.GGUFValueType.UINT32, None)
    kv.setdefault("tokenizer.ggml.add_bos_token", (False, gguf.GGUFValueType.BOOL, None))
    for key, (value, vtype, sub) in kv.items():
        w.add_key_value(key, value, vtype, sub)
    plan = _tensor_plan(s, n_vocab, arch["tied"])
    for name, shape, init in plan:
        dtype = np.float32 if len(shape) == 1 else np.float16
        w.add_tensor_info(name, shape, np.dtype(dtype), math.prod(shape) * np.dtype(dtype).itemsize)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    seeds = seed.spawn(len(plan))
    n_params, embd = 0, None
    for (name, shape, init), sd in zip(plan, seeds):
        if init == "ones":
            arr = np.ones(shape, dtype=np.float32)
        elif init == "zeros":
            arr = np.zeros(shape, dtype=np.float32)
        elif init == "output":  # row r: its predecessor's embedding (tied, each token would be its own successor)
            arr = np.zeros(shape, dtype=np.float16)
            arr[plain] = embd[np.random.default_rng(sd).permutation(plain)] / (INIT_STD["embd"] * math.sqrt(shape[1]))
        else:
            arr = _random_f16(shape, sd, threads, INIT_STD[init])
            if init == "embd":
                embd = arr
                if arch["tied"]:
                    arr[special] = 0
        if not np.isfinite(arr).all():
            raise PhaseError(f"non-finite values in {name}")
        w.write_tensor_data(arr)
        n_params += arr.size
    w.close()
    return n_params


def quantize(src: Path, dst: Path, quant: str, threads: int) -> None:
    import llama_cpp as ll

    params = ll.llama_model_quantize_default_params()
    params.nthread = threads
    params.ftype = QUANTS[quant]
    rc = ll.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params))
    if rc != 0 or not dst.is_file():
        raise PhaseError(f"llama_model_quantize({src.name} -> {quant}) returned {rc}")


_LLAMA_LOG: list[str] = []
_LLAMA_LOG_CB = None


def _capture_llama_log() -> list[str]:
    """Route llama.cpp's log through one callback that lives as long as the process (llama.cpp keeps the
    pointer): every line goes to stderr (gpu_check.log) and into the list returned."""
    global _LLAMA_LOG_CB
    import llama_cpp as ll

    if _LLAMA_LOG_CB is None:
        @ll.llama_log_callback
        def cb(level, text, user_data):  # noqa: ARG001
            line = text.decode("utf-8", "replace")
            _LLAMA_LOG.append(line)
            sys.stderr.write(line)

        _LLAMA_LOG_CB = cb
        ll.llama_log_set(cb, ctypes.c_void_p(0))
    return _LLAMA_LOG


def check_model(path: Path, n_gpu_layers: int, threads: int) -> dict:
    """Load through llama.cpp (on the device the runs use), evaluate a short prompt with logits for every
    position: all finite? does any position's greedy choice end the generation? how close are the top two?"""
    import llama_cpp as ll
    import numpy as np

    from speclocal.models import layout as layouts
    from speclocal.models.devices import compute_label, devices

    logs = _capture_llama_log()
    logs.clear()
    ll.llama_backend_init()
    # a weight layout that survives a test decode here (llama.cpp's AMX kernels crash on some Xeons under KVM)
    layout = layouts.choose([path], compute_label(n_gpu_layers, devices()), n_gpu_layers, None)
    mp = ll.llama_model_default_params()
    mp.n_gpu_layers = n_gpu_layers
    overrides = layouts.apply(mp, layout.layout, path)
    model = ll.llama_model_load_from_file(str(path).encode(), mp)
    del overrides
    if not model:
        raise PhaseError(f"llama.cpp could not load {path.name}: {''.join(logs[-5:]).strip()}")
    cp = ll.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch = 256, 64, 64
    cp.n_threads = cp.n_threads_batch = threads
    ctx = ll.llama_init_from_model(model, cp)
    if not ctx:
        ll.llama_model_free(model)
        raise PhaseError(f"llama.cpp could not make a context for {path.name}")
    try:
        vocab = ll.llama_model_get_vocab(model)
        n_vocab = ll.llama_vocab_n_tokens(vocab)
        text = PROMPT.encode()
        buf = (ll.llama_token * 512)()
        n = ll.llama_tokenize(vocab, text, len(text), buf, 512, False, True)
        toks = list(buf[:max(0, n)])[:48]
        if not toks:
            raise PhaseError("the vocabulary tokenized the prompt to nothing")
        batch = ll.llama_batch_init(len(toks), 0, 1)
        try:
            for i, t in enumerate(toks):
                batch.token[i], batch.pos[i], batch.n_seq_id[i] = t, i, 1
                batch.seq_id[i][0] = 0
                batch.logits[i] = True
            batch.n_tokens = len(toks)
            rc = ll.llama_decode(ctx, batch)
            if rc != 0:
                raise PhaseError(f"llama_decode returned {rc} on {path.name}")
            logits = np.ctypeslib.as_array(ll.llama_get_logits(ctx), shape=(len(toks), n_vocab)).copy()
        finally:
            ll.llama_batch_free(batch)
        finite = bool(np.isfinite(logits).all())
        eog = [int(a) for a in logits.argmax(axis=1) if ll.llama_vocab_is_eog(vocab, int(a))]  # vocab: the model's
    finally:
        ll.llama_free(ctx)
        ll.llama_model_free(model)
    top2 = np.sort(logits, axis=1)[:, -2:] if finite else None
    text_log = "".join(logs)
    off = re.search(r"offloaded (\d+)/(\d+) layers to GPU", text_log)
    devs = re.findall(r"using device (\S+) \(([^)]*)\)", text_log)
    return {"finite": finite, "n_tokens": len(toks), "greedy_eog_positions": len(eog),
            "logit_std": float(logits.std()) if finite else None,
            "top2_margin_median": float(np.median(top2[:, 1] - top2[:, 0])) if finite else None,
            "offloaded": f"{off.group(1)}/{off.group(2)} layers on the GPU" if off else None,
            "devices_used": [f"{a} ({b})" for a, b in devs], "layout": layout.layout, "layout_note": layout.note}


def worker_models(p: dict) -> dict:
    import numpy as np

    out_dir = Path(p["dir"])
    shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.mkdir(parents=True)
    _capture_llama_log()  # before quantizing: its per-tensor lines go to the log, not the terminal
    if p["vocab"] == "synthetic":
        vocab_path = out_dir / "vocab-synthetic.gguf"
        write_synthetic_vocab(vocab_path)
        vocab_source = "synthetic byte-level BPE (no real vocabulary given)"
    else:
        vocab_path = Path(p["vocab"])
        vocab_source = f"real Qwen2 from {vocab_path.name}"
    t = time.monotonic()
    tok = read_tokenizer(vocab_path)
    n_vocab = len(tok["tokenizer.ggml.tokens"][0])
    progress(f"vocabulary: {n_vocab:,} tokens ({vocab_source}) in {time.monotonic() - t:.1f} s")
    seed = np.random.SeedSequence(p["seed"])
    models = {}
    for (role, shape), sd in zip(p["shapes"].items(), seed.spawn(len(p["shapes"]))):
        rec: dict = {"shape": shape}
        f16 = out_dir / f"{role}-f16.gguf"
        q = out_dir / f"{role}-{p['quant']}.gguf"
        t = time.monotonic()
        rec["n_params"] = write_model(f16, shape, p["arch"], tok, sd, p["threads"])
        rec["f16_bytes"] = f16.stat().st_size
        rec["write_s"] = round(time.monotonic() - t, 1)
        progress(f"{role}: {shape['label']}, {_params(rec['n_params'])} params, f16 {rec['f16_bytes'] / 2**20:.1f} MiB "
                 f"in {rec['write_s']} s; quantizing to {p['quant']}")
        t = time.monotonic()
        quantize(f16, q, p["quant"], p["threads"])
        rec["quantize_s"] = round(time.monotonic() - t, 1)
        if not p.get("keep_f16"):
            f16.unlink()
        rec["path"], rec["quant"], rec["quant_bytes"] = str(q), p["quant"].upper(), q.stat().st_size
        t = time.monotonic()
        types = rec["tensor_types_mib"] = tensor_types(q)
        rec["inspect_s"] = round(time.monotonic() - t, 1)
        t = time.monotonic()
        rec["check"] = check_model(q, p["n_gpu_layers"], p["check_threads"])
        rec["check_s"] = round(time.monotonic() - t, 1)
        progress(f"{role}: {rec['quant_bytes'] / 2**20:.1f} MiB {rec['quant']} in {rec['quantize_s']} s "
                 f"({', '.join(f'{k} {v} MiB' for k, v in types.items())}); logits finite: {rec['check']['finite']}, "
                 f"{rec['check']['offloaded'] or 'CPU'}")
        models[role] = rec
    return {"vocab": {"source": vocab_source, "n_vocab": n_vocab, "path": str(vocab_path)},
            "init": f"normal(0, std) matrices (f16), std {INIT_STD}; output rows: a random successor order of the "
                    "plain tokens; norms 1, biases 0; special tokens' output rows 0",
            "arch": p["arch"], "models": models}


def run_drafts(n_drafted: int, n_passes: int, k: int) -> list[int]:
    """The draft length of each main pass, rebuilt from a run's totals: k per pass, the remainder once (the
    engine drafts fewer only where -n leaves less room), 0 for the passes left (plain steps)."""
    drafts = [k] * (n_drafted // k) + ([n_drafted % k] if n_drafted % k else [])
    return drafts + [0] * max(0, n_passes - len(drafts))


def iid_acceptance(n_accepted: int, drafts: list[int]) -> float | None:
    """The i.i.d. per-token acceptance a for which the expected accepted drafts, the sum over steps of
    a + a^2 + ... + a^d, equal the run's n_accepted (bisection: that sum grows with a)."""
    from speclocal.policy.costmodel import expected_tokens

    total = sum(drafts)
    if total == 0:
        return None
    if n_accepted <= 0:
        return 0.0
    if n_accepted >= total:
        return 1.0

    def expected(a: float) -> float:
        return sum(expected_tokens(a, d) - 1 for d in drafts)

    lo, hi = 0.0, 1.0 - 1e-12
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected(mid) < n_accepted else (lo, mid)
    return (lo + hi) / 2


def worker_predict(p: dict) -> dict:
    from speclocal.policy.costmodel import CostCurve, predicted_run_speedup, predicted_speedup

    out, errors = {}, []
    for name, r in p["runs"].items():
        prof = p.get("profile" if r["draft"] == "draft" else "profile_self")
        spec = r.get("spec")
        if r.get("flags"):  # the profiles were measured as users run, without these flags
            out[name] = {"predicted_speedup": None, "reason": f"no profile with {' '.join(r['flags'])}"}
            continue
        if not prof or not spec or not spec.get("n_passes"):
            out[name] = {"predicted_speedup": None, "reason": "no profile or no speculative run"}
            continue
        curve = CostCurve.from_dict(prof["curve"])
        k, c = r["k"], curve.draft_cost
        drafts = run_drafts(spec["n_drafted"], spec["n_passes"], k)
        a = iid_acceptance(spec["n_accepted"], drafts)
        if a is None:
            out[name] = {"predicted_speedup": None, "reason": "nothing was drafted"}
            continue
        pred = predicted_run_speedup(a, drafts, c, curve)
        meas = r.get("measured_speedup")
        err = pred / meas - 1 if meas else None
        if err is not None:
            errors.append(abs(err))
        out[name] = {"acceptance_iid": a, "c": c, "V_k1": curve.V(k + 1), "passes": len(drafts),
                     "predicted_speedup": pred, "predicted_fixed_k": predicted_speedup(a, k, c, curve),
                     "predicted_at_full_acceptance": predicted_speedup(1.0, k, c, curve),
                     "measured_speedup": meas, "error": err}
    med = statistics.median(errors) if errors else None
    return {"runs": out, "summary": {"median_abs_error": med, "runs": len(errors)}}


WORKERS = {"inspect": worker_inspect, "models": worker_models, "predict": worker_predict}


def worker_main(kind: str, in_path: str, result_path: str) -> int:
    payload = json.loads(Path(in_path).read_text())
    try:
        data = WORKERS[kind](payload)
        rc = 0
    except Exception as e:  # noqa: BLE001 - reported through the result file
        traceback.print_exc()
        data, rc = {"error": f"{type(e).__name__}: {e}"}, 1
    Path(result_path).write_text(json.dumps(data, default=str))
    return rc


# =====================================================================================================

def parse_args(argv: list[str] | None) -> argparse.Namespace:
    phases = __doc__[__doc__.index("Phases in the order"):__doc__.index("Where `nvidia-smi -L`")]
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=phases + "\nOn the GPU machine: python3 scripts/gpu_check.py --bundle gpu-bundle "
                                       "--out $OUT")
    p.add_argument("--bundle", help="the folder scripts/build_gpu_bundle.py made (needed unless --skip-build)")
    p.add_argument("--out", default=None, help="where gpu_check.json / .md / .log and build.log go (default WORK/out)")
    p.add_argument("--work", default=None, help="scratch folder: sources, build, site, models "
                                                "(default /tmp/speclocal-gpu-check)")
    p.add_argument("--shapes", choices=tuple(SHAPES), default="full",
                   help="full: Qwen2.5-1.5B- and 0.5B-shaped models; tiny: a few layers, for the CPU test")
    p.add_argument("--skip-build", action="store_true",
                   help="use the llama-cpp-python already installed (in --work from an earlier build, else this Python's)")
    p.add_argument("--time-budget", type=float, default=DEFAULT_BUDGET,
                   help=f"seconds for everything (default {DEFAULT_BUDGET}: a device command may run 600)")
    p.add_argument("--backend", choices=("auto", "cuda", "cpu"), default="auto",
                   help="what to build for (auto: CUDA where nvidia-smi sees a GPU and nvcc is there)")
    p.add_argument("--no-cuda-fa", action="store_true",
                   help="build without the CUDA FlashAttention kernels (-DGGML_CUDA_FA=OFF; default: with them, "
                        "as a normal CUDA build has them)")
    p.add_argument("--cuda-arch", default="native", help="CMAKE_CUDA_ARCHITECTURES (default native: the GPU here)")
    p.add_argument("--jobs", type=int, default=None, help="parallel build jobs (default: all cores)")
    p.add_argument("--build-cap", type=float, default=CAP["build"],
                   help=f"seconds the build may take at most (default {CAP['build']}; a CPU-only build took 204 s "
                        "on a 2-core Intel Xeon (AMX))")
    p.add_argument("--cap-scale", type=float, default=1.0,
                   help="multiply every phase's own limit but the build's (the 16-core GPU machine's) by this: "
                        "e.g. 8 for full shapes on a 2-core CPU")
    p.add_argument("--ngl", default="auto", help="-ngl for every run: auto (default, what users get: every "
                   "layer where the build can offload), all or a number")
    p.add_argument("-t", "--threads", type=int, default=None,
                   help="-t for every run (default: speclocal's, physical cores; 1 with --shapes tiny, whose "
                        "sub-millisecond decodes time OpenMP barriers more than the model on a shared CPU)")
    p.add_argument("--quant", choices=tuple(QUANTS), default="q4_k_m", help="quantization type (default q4_k_m)")
    p.add_argument("--vocab", default="auto", help="vocabulary GGUF, or 'synthetic' (default: the bundle's "
                                                   "ggml-vocab-qwen2.gguf; synthetic for --shapes tiny without one)")
    p.add_argument("--speclocal-from", choices=("auto", "wheel", "tree"), default="auto",
                   help="our bundled wheel, or this tree's app/ (auto: the wheel if built from this tree's sources)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    p.add_argument("--keep-f16", action="store_true", help="keep the f16 models next to the quantized ones")
    p.add_argument("--_worker", choices=tuple(WORKERS), help=argparse.SUPPRESS)
    p.add_argument("--_in", help=argparse.SUPPRESS)
    p.add_argument("--_result", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.work is None:
        args.work = "/tmp/speclocal-gpu-check"
    if args.out is None:
        args.out = str(Path(args.work) / "out")
    if args.threads is None and args.shapes == "tiny":
        args.threads = 1
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args._worker:
        return worker_main(args._worker, args._in, args._result)
    if not args.skip_build and not args.bundle:
        print("gpu_check: the build needs --bundle (or pass --skip-build)", file=sys.stderr)
        return 2
    devices = tree_devices()
    try:  # a bad -ngl fails here, in one line, not after the build's minutes
        devices.resolve_gpu_layers(args.ngl, offload_supported=False)
    except devices.SpeclocalError as e:
        print(f"gpu_check: error: {e}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _interrupt)
    return Check(args).run()


def _interrupt(signum, frame) -> None:
    """SIGTERM unwinds like Ctrl-C: the JSON and the summary are still written."""
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())
