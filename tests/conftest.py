"""Shared fixtures: every user location in temporary directories; the real GGUF models from the catalogue,
fetched by README command (2); scripts/ as modules.

A test that asks for a model fixture is marked `models` by itself (see `pytest_collection_modifyitems`), so
`pytest -m "not models"` runs everything that needs no model file. Tests marked `slow` (minutes: a build of
llama.cpp) are skipped unless `--slow` is given.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from speclocal import locations
from speclocal.models.catalogue import load_catalogue

MODEL_FIXTURES = {"tiny_main", "tiny_draft", "smollm2", "gemma3"}


def pytest_addoption(parser) -> None:
    parser.addoption("--slow", action="store_true", help="also run the tests marked slow (minutes each)")


def pytest_collection_modifyitems(config, items) -> None:
    run_slow = config.getoption("--slow")
    for item in items:
        if MODEL_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.models)
        if "slow" in item.keywords and not run_slow:
            item.add_marker(pytest.mark.skip(reason="slow (minutes): run with --slow"))


@pytest.fixture(scope="session")
def _session_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(autouse=True)
def user_dirs(tmp_path, monkeypatch, _session_cache) -> dict[str, Path]:
    """Every location of speclocal.locations away from the user's own: config, data (the suffix store) and
    logs per test, the cache (machine profiles, learnt priors) per session, so a machine profile is measured
    once (again only for a context deeper than it reached). Model files stay where `speclocal fetch` put them."""
    dirs = {"config": tmp_path / "config", "logs": tmp_path / "logs", "cache": _session_cache, "data": tmp_path / "data"}
    monkeypatch.setenv(locations.CONFIG_ENV, str(dirs["config"]))
    monkeypatch.setenv(locations.DATA_ENV, str(dirs["data"]))
    monkeypatch.setenv(locations.LOG_ENV, str(dirs["logs"]))
    monkeypatch.setenv(locations.CACHE_ENV, str(dirs["cache"]))
    return dirs


@pytest.fixture
def fresh_priors(tmp_path, monkeypatch) -> Path:
    """A priors file of this test's own (the session's learnt priors left alone)."""
    path = tmp_path / "priors.json"
    monkeypatch.setattr(locations, "priors_path", lambda: path)
    return path


def _model_path(model_id: str) -> Path:
    entry = load_catalogue().model(model_id)
    path = locations.models_dir() / entry.file
    if not path.is_file():
        pytest.fail(f"{path} is missing: run `speclocal fetch tiny smollm2-135m gemma3-270m` first (README command 2 "
                    "does)")
    return path


@pytest.fixture(scope="session")
def tiny_main() -> Path:
    return _model_path("qwen2.5-coder-1.5b-q4km")


@pytest.fixture(scope="session")
def tiny_draft() -> Path:
    return _model_path("qwen2.5-coder-0.5b-q4km")


@pytest.fixture(scope="session")
def smollm2() -> Path:
    return _model_path("smollm2-135m")


@pytest.fixture(scope="session")
def gemma3() -> Path:
    """Gemma 3 270M: sliding-window attention in most layers (window 512), for cache handling."""
    return _model_path("gemma3-270m")


@pytest.fixture(scope="session")
def load_script():
    """Import a file of scripts/ (runnable helpers, not a package) as a module: load_script("name")."""
    def load(name: str):
        path = Path(__file__).resolve().parent.parent / "scripts" / f"{name}.py"
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod

    return load
