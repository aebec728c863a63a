"""The engine: llama.cpp models, one decode loop, drafters, sampling and metrics. No UI imports."""

from speclocal.engine.drafters import DraftParams
from speclocal.engine.generate import MODES, Engine, GenerationRequest, GenerationResult, MemoryParts, StepEvent
from speclocal.engine.sampling import Sampling

__all__ = [
    "MODES", "DraftParams", "Engine", "GenerationRequest", "GenerationResult", "MemoryParts", "Sampling", "StepEvent",
]
