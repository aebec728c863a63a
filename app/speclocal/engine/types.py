"""What a generation reports: plain dataclasses with no llama.cpp import, so front ends can use them
without loading the engine."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class StepEvent:
    """One main-model pass: the tokens it produced and where they came from."""

    tokens: list[int]
    pieces: list[str]  # decoded text of each token (may be "" inside a multi-byte character)
    from_draft: list[bool]
    drafted: int
    accepted: int
    t_draft: float
    t_verify: float
    t_sample: float
    n_generated: int  # total so far
    elapsed: float  # seconds since decoding started (after prompt processing)


@dataclass
class MemoryParts:
    main_weights: int
    draft_weights: int
    main_kv: int
    draft_kv: int


@dataclass
class GenerationResult:
    mode: str
    text: str
    tokens: list[int]
    from_draft: list[bool]
    stop_reason: str  # eos | stop | length | context | cancelled
    n_prompt: int
    n_prompt_cached: int
    t_prompt: float
    ttft: float
    n_generated: int
    t_decode: float
    decode_tps: float
    n_drafted: int
    n_accepted: int
    acceptance: float | None
    n_passes: int
    tokens_per_pass: float
    t_draft: float
    t_verify: float
    t_sample: float
    draft_share: float
    peak_rss: int
    memory: MemoryParts
    auto: dict | None = None  # auto mode: what it chose and why
    steps: list[tuple[int, int, int, float]] = field(default_factory=list)  # (tokens, drafted, accepted, end time)

    def to_dict(self, steps: bool = False) -> dict:
        d = asdict(self)
        if not steps:
            d.pop("steps")
        return d
