"""State files (settings, profiles, learnt priors, reports): atomic writes; a corrupt file is reported and set aside."""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Iterable

log = logging.getLogger("speclocal.files")


def atomic_write(path: Path, data: str | bytes | Iterable[bytes], mode: int | None = None) -> int:
    """Write `data` (text, bytes, or chunks of bytes) via a temp file in the same directory, fsync it, rename it
    over `path` and fsync the directory: readers see the old or the new file, even after a crash. `mode`:
    the file's permissions (e.g. 0o600 for the user's own data). Returns the bytes written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    chunks = [data.encode("utf-8")] if isinstance(data, str) else [data] if isinstance(data, bytes) else data
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        if mode is not None:
            os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
            size = f.tell()
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    fsync_dir(path.parent)
    return size


def fsync_dir(directory: Path) -> None:
    """Make a rename or unlink in `directory` survive a crash (where the OS lets us)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def set_aside(path: Path, why: str, label: str = "corrupt") -> Path | None:
    """Rename a damaged (or outdated: `label`) file to <name>.<label>-<time> (never over an earlier one) and log
    a warning naming both, so nothing is lost and the caller starts fresh."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    target, i = path.with_name(f"{path.name}.{label}-{stamp}"), 1
    while target.exists():
        target, i = path.with_name(f"{path.name}.{label}-{stamp}-{i}"), i + 1
    try:
        os.replace(path, target)
    except OSError:
        return None
    log.warning("%s is %s (%s); set aside as %s and starting fresh", path,
                "damaged" if label == "corrupt" else label, why, target.name)
    return target


def read_json(path: Path) -> object | None:
    """The JSON in `path`; None if it does not exist; a corrupt file is set aside (None)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as e:
        set_aside(path, str(e))
        return None
    try:
        return json.loads(text)
    except ValueError as e:
        set_aside(path, f"not JSON: {e}")
        return None
