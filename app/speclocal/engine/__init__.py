"""The engine: llama.cpp models, one decode loop, drafters, sampling and metrics. No UI or policy imports.

Names are loaded on first use, so `speclocal.engine.types` (requests, results) can be imported without llama.cpp.
"""

from importlib import import_module

_EXPORTS = {
    "Engine": "generate",
    "GenerationRequest": "types", "GenerationResult": "types",
    "MemoryParts": "types", "StepEvent": "types",
    "DraftParams": "drafting.base", "Sampling": "sampling",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'speclocal.engine' has no attribute {name!r}")
    return getattr(import_module(f"speclocal.engine.{_EXPORTS[name]}"), name)
