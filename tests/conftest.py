"""Shared fixtures: the real GGUF models from the catalogue, fetched by README command (2); scripts/ as modules."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from speclocal.models.catalogue import load_catalogue, models_dir


def _model_path(model_id: str) -> Path:
    entry = load_catalogue().model(model_id)
    path = models_dir() / entry.file
    if not path.is_file():
        pytest.fail(f"{path} is missing: run `speclocal fetch tiny smollm2-135m` first (README command 2 does)")
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
def load_script():
    """Import a file of scripts/ (runnable helpers, not a package) as a module: load_script("name")."""
    def load(name: str):
        path = Path(__file__).resolve().parent.parent / "scripts" / f"{name}.py"
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod

    return load
