"""Every place speclocal reads or writes outside the project, each with its one environment override.

| what | override | default (platformdirs) |
|---|---|---|
| model files | `$SPECLOCAL_MODELS` (or `--dir`) | user cache dir `/models` |
| machine profiles, learnt priors, weight layout verdicts, draft rankings | `$SPECLOCAL_CACHE_DIR` | user cache dir |
| TUI settings, exported history | `$SPECLOCAL_CONFIG_DIR` | user config dir |
| the suffix drafter's store of earlier generations | `$SPECLOCAL_DATA_DIR` | user data dir `/suffix-store` |
| logs (the TUI's llama.cpp log) | `$SPECLOCAL_LOG_DIR` | user log dir |
| the model catalogue | `$SPECLOCAL_CATALOGUE` | `models.toml` at the project root |
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

APP = "speclocal"
MODELS_ENV = "SPECLOCAL_MODELS"
CACHE_ENV = "SPECLOCAL_CACHE_DIR"
CONFIG_ENV = "SPECLOCAL_CONFIG_DIR"
LOG_ENV = "SPECLOCAL_LOG_DIR"
DATA_ENV = "SPECLOCAL_DATA_DIR"
CATALOGUE_ENV = "SPECLOCAL_CATALOGUE"


def _dir(env: str, default: str) -> Path:
    value = os.environ.get(env)
    return Path(value).expanduser() if value else Path(default)


def models_dir(override: str | os.PathLike | None = None) -> Path:
    """Where model files live: `override` (--dir), else $SPECLOCAL_MODELS, else the user cache dir."""
    if override:
        return Path(override).expanduser()
    return _dir(MODELS_ENV, str(Path(platformdirs.user_cache_dir(APP)) / "models"))


def cache_dir() -> Path:
    return _dir(CACHE_ENV, platformdirs.user_cache_dir(APP))


def profiles_dir() -> Path:
    """Measured cost curves, one file per machine + pair + settings."""
    return cache_dir() / "profiles"


def rankings_dir() -> Path:
    """Measured draft-model rankings (`speclocal drafts`), one file per main model."""
    return cache_dir() / "drafts"


def layouts_path() -> Path:
    """Which weight layouts survived (or crashed) a test decode, per llama.cpp build, CPU and device."""
    return cache_dir() / "layouts.json"


def priors_path() -> Path:
    """Auto mode's acceptance priors per task type, learnt from earlier runs."""
    return cache_dir() / "priors.json"


def config_dir() -> Path:
    return _dir(CONFIG_ENV, platformdirs.user_config_dir(APP))


def config_path() -> Path:
    """The TUI's settings file."""
    return config_dir() / "config.toml"


def history_dir() -> Path:
    """Where the TUI exports its history (ctrl+s): next to the settings file."""
    return config_dir()


def data_dir() -> Path:
    """What speclocal keeps of the user's own work (not a cache: deleting it loses something)."""
    return _dir(DATA_ENV, platformdirs.user_data_dir(APP))


def suffix_store_dir() -> Path:
    """The suffix drafter's store: the prompts and outputs of earlier generations, one store per tokenizer
    (user-only permissions: it holds what the user typed and got)."""
    return data_dir() / "suffix-store"


def log_dir() -> Path:
    return _dir(LOG_ENV, platformdirs.user_log_dir(APP))


def tui_log_path() -> Path:
    """The TUI's log: llama.cpp's and the engine process's output, never drawn on the screen."""
    return log_dir() / "tui.log"


def catalogue_path() -> Path:
    """models.toml: $SPECLOCAL_CATALOGUE, else the one at the project root."""
    env = os.environ.get(CATALOGUE_ENV)
    return Path(env) if env else Path(__file__).resolve().parents[2] / "models.toml"
