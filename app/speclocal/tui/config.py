"""The TUI's settings file: one flat TOML file (speclocal.locations.config_path), written atomically.

It holds the settings speclocal.options marks `saved`, with their declared types and defaults. The writer
is a few lines on purpose (no dependency): one `[settings]` table of strings, integers, floats and
booleans. Unknown keys are ignored and wrong types fall back to the default, so an old or hand-edited
file never stops the app from starting.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import replace
from pathlib import Path

from speclocal.files import atomic_write, set_aside
from speclocal.locations import config_path
from speclocal.options import BY_NAME, Settings, saved_fields


def load_settings(path: Path | None = None) -> tuple[Settings, str | None]:
    """(settings, warning): defaults for a missing file; a warning names anything that was ignored."""
    path = path or config_path()
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return Settings(), None
    except OSError as e:
        return Settings(), f"cannot read {path}: {e}; using defaults"
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        aside = set_aside(path, f"not valid TOML: {e}")
        where = f"set aside as {aside.name}" if aside else "left in place"
        return Settings(), f"{path} is not valid TOML ({e}); {where}, using defaults"
    table = data.get("settings", {})
    if not isinstance(table, dict):
        return Settings(), f"{path}: [settings] is not a table; using defaults"
    values, ignored = {}, []
    for name in saved_fields():
        if name not in table:
            continue
        v, want = table[name], BY_NAME[name].type
        if want is float and isinstance(v, int) and not isinstance(v, bool):
            v = float(v)
        if type(v) is not want:
            ignored.append(name)
            continue
        values[name] = v
    settings = replace(Settings(), **values)
    bad = settings.problems(style="label")
    if bad:
        return Settings(), f"{path}: {bad[0]}; using defaults"
    return settings, (f"{path}: ignored {', '.join(ignored)} (wrong type)" if ignored else None)


def _toml_string(s: str) -> str:
    out = ['"']
    for ch in s:
        code = ord(ch)
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\u{code:04X}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def toml_value(v: object) -> str:
    """One TOML value for a str, bool, int or float."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return _toml_string(v)
    raise TypeError(f"cannot write {type(v).__name__} to TOML")


def dumps(settings: Settings) -> str:
    lines = ["# speclocal TUI settings (written by the app; edit with care)", "[settings]"]
    lines += [f"{k} = {toml_value(getattr(settings, k))}" for k in saved_fields()]
    return "\n".join(lines) + "\n"


def save_settings(settings: Settings, path: Path | None = None) -> Path:
    path = path or config_path()
    atomic_write(path, dumps(settings))
    return path
