"""State files (settings, profiles, learnt priors, reports): atomic writes; a corrupt file is reported and set aside."""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from pathlib import Path

log = logging.getLogger("speclocal.files")


def atomic_write(path: Path, text: str) -> None:
    """Write via a temp file in the same directory and rename: readers see the old or the new file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def set_aside(path: Path, why: str) -> Path | None:
    """Rename a damaged file to <name>.corrupt-<time> and log a warning naming both."""
    target = path.with_name(f"{path.name}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}")
    try:
        os.replace(path, target)
    except OSError:
        return None
    log.warning("%s is damaged (%s); set aside as %s and starting fresh", path, why, target.name)
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
