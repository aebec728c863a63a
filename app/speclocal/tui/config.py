"""The TUI's settings: one flat TOML file in the platformdirs config dir, written atomically.

The writer is a few lines on purpose (no dependency): the file holds one `[settings]` table of
strings, integers, floats and booleans. Unknown keys are ignored and wrong types fall back to the
default, so an old or hand-edited file never stops the app from starting.
"""

from __future__ import annotations

import math
import os
import tomllib
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

from speclocal.state import atomic_write, set_aside

CONFIG_DIR_ENV = "SPECLOCAL_CONFIG_DIR"
CONFIG_NAME = "config.toml"

DRAFT_SOURCES = ("model", "lookup", "auto", "none")
ORDERS = ("alternate", "plain-first", "spec-first")
TASKS = ("auto", "code", "edit", "json", "chat", "creative")  # auto = detect from the prompt


@dataclass(frozen=True)
class Settings:
    """Everything the user can change in the settings screen (and the last pair used)."""

    pair: str = ""  # catalogue pair id; "" = the catalogue's default pair
    main: str = ""  # main model override: catalogue id or GGUF path; "" = the pair's
    draft: str = ""  # draft model override: catalogue id or GGUF path; "" = the pair's
    draft_source: str = "model"  # model | lookup (prompt lookup) | auto (engine decides per step) | none
    draft_max: int = 3
    draft_min: int = 0
    draft_p_min: float = 0.0
    temperature: float = 0.0
    seed: int = 0
    n_predict: int = 256
    threads: int = 0  # 0 = physical cores
    ctx_size: int = 4096
    n_gpu_layers: int = 0
    order: str = "alternate"  # alternate | plain-first | spec-first
    color_drafts: bool = True
    task: str = "auto"  # auto (detect) | code | edit | json | chat | creative
    system_prompt: str = ""

    def validate(self) -> list[str]:
        """Problems a user must fix, as short sentences (empty when the settings are usable)."""
        errors = []
        if self.draft_source not in DRAFT_SOURCES:
            errors.append(f"draft source must be one of {', '.join(DRAFT_SOURCES)}")
        if self.order not in ORDERS:
            errors.append(f"order must be one of {', '.join(ORDERS)}")
        if self.task not in TASKS:
            errors.append(f"task must be one of {', '.join(TASKS)}")
        if self.draft_max < 1 or self.draft_max > 64:
            errors.append("draft max must be between 1 and 64")
        if self.draft_min < 0 or self.draft_min > self.draft_max:
            errors.append("draft min must be between 0 and draft max")
        if not 0.0 <= self.draft_p_min <= 1.0:
            errors.append("draft p-min must be between 0 and 1")
        if not 0.0 <= self.temperature <= 5.0:
            errors.append("temperature must be between 0 and 5")
        if self.seed < 0:
            errors.append("seed must be >= 0")
        if not 1 <= self.n_predict <= 32768:
            errors.append("max tokens must be between 1 and 32768")
        if self.threads < 0 or self.threads > 512:
            errors.append("threads must be 0 (auto) or a positive number")
        if not 64 <= self.ctx_size <= 1 << 20:
            errors.append("context must be between 64 and 1048576 tokens")
        if self.n_gpu_layers < 0 or self.n_gpu_layers > 999:
            errors.append("GPU layers must be between 0 and 999")
        return errors

    @property
    def wants_draft_model(self) -> bool:
        return self.draft_source in ("model", "auto")

    def load_key(self) -> tuple:
        """The settings that need the models reloaded when they change."""
        return (self.pair, self.main, self.draft, self.threads, self.ctx_size, self.n_gpu_layers,
                self.wants_draft_model)


def config_dir() -> Path:
    """$SPECLOCAL_CONFIG_DIR, else platformdirs' user config dir for speclocal."""
    env = os.environ.get(CONFIG_DIR_ENV)
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_config_dir("speclocal"))


def config_path() -> Path:
    return config_dir() / CONFIG_NAME


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
    for f in fields(Settings):
        if f.name not in table:
            continue
        v = table[f.name]
        want = type(getattr(Settings(), f.name))
        if want is float and isinstance(v, int) and not isinstance(v, bool):
            v = float(v)
        if type(v) is not want:
            ignored.append(f.name)
            continue
        values[f.name] = v
    settings = replace(Settings(), **values)
    bad = settings.validate()
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
    lines += [f"{k} = {toml_value(v)}" for k, v in asdict(settings).items()]
    return "\n".join(lines) + "\n"


def save_settings(settings: Settings, path: Path | None = None) -> Path:
    path = path or config_path()
    atomic_write(path, dumps(settings))
    return path
