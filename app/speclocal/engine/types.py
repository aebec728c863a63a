"""What a generation is asked for and what it reports: plain dataclasses with no llama.cpp import, so front
ends (the TUI, bench, the CLI) build requests and read results without loading the engine."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from speclocal import options
from speclocal.drafts import MODES, Source
from speclocal.engine.drafting.base import DraftParams
from speclocal.engine.sampling import Sampling
from speclocal.errors import SpeclocalError

STORE_USES = ("on", "read", "off")


@dataclass(frozen=True)
class GenerationRequest:
    """What to generate. Give `messages` (chat, through the model's template) or `prompt` (raw).
    `fit_context`: drop the oldest chat turns (never system messages or the last message) until the prompt
    leaves `n_predict` tokens free; the result says how many turns went. `reuse_limit`: compared modes start
    from the same line when the later ones reuse no more of the main model's cache than the first did."""

    messages: tuple[dict, ...] | None = None
    prompt: str | None = None
    mode: str = Source.MODEL.mode  # one of MODES
    n_predict: int = options.default("n_predict")
    sampling: Sampling = field(default_factory=Sampling)
    draft: DraftParams = field(default_factory=DraftParams)
    stop: tuple[str, ...] = ()
    task: str | None = None  # auto mode: code | edit | json | chat | creative; None = detect from the prompt
    fit_context: bool = False
    reuse_limit: int | None = None  # reuse at most this many cached prompt tokens (None: all that match)
    # the engine's suffix store (modes suffix and auto): "on" drafts from it and adds this generation, "read"
    # only drafts from it (benchmarks: no run learns another's answer), "off" neither reads nor writes it
    store: str = "on"

    def __post_init__(self) -> None:
        if (self.messages is None) == (self.prompt is None):
            raise SpeclocalError("give either chat messages or a raw prompt")
        if self.mode not in MODES:
            raise SpeclocalError(f"unknown mode {self.mode!r} (choose from {', '.join(MODES)})")
        if self.store not in STORE_USES:
            raise SpeclocalError(f"store must be one of {', '.join(STORE_USES)}, got {self.store!r}")
        options.check("n_predict", self.n_predict)

    @classmethod
    def from_settings(cls, s: options.Settings, mode: str, text: str | None = None,
                      messages: tuple[dict, ...] | None = None, **kw) -> "GenerationRequest":
        """A request with the sampling, draft and stop settings of `s`, for chat `messages`, or else for `text`:
        raw when `s.raw`, otherwise as the user's message after `s.system_prompt`."""
        common = dict(mode=mode, n_predict=s.n_predict, stop=tuple(s.stop),
                      sampling=Sampling(temp=s.temperature, top_k=s.top_k, top_p=s.top_p, min_p=s.min_p, seed=s.seed),
                      draft=DraftParams(max=s.draft_max, min=s.draft_min, p_min=s.draft_p_min,
                                        lookup_max=s.lookup_max), store="on" if s.store else "off")
        common.update(kw)
        if messages is None and s.raw:
            return cls(prompt=text, **common)
        if messages is None:
            system = [{"role": "system", "content": s.system_prompt}] if s.system_prompt else []
            messages = tuple(system + [{"role": "user", "content": text}])
        return cls(messages=tuple(messages), **common)

    @property
    def last_user_text(self) -> str:
        """The text auto mode classifies: the raw prompt, or the newest user message."""
        if self.messages is None:
            return self.prompt or ""
        return next((m["content"] for m in reversed(self.messages) if m.get("role") == "user"), "")


def same_seed(requests: list[GenerationRequest]) -> list[GenerationRequest]:
    """The requests with one seed between them: the given one, or one drawn at random for all of them, so
    that compared modes sample from the same seed (and the seed used is recorded)."""
    seed = requests[0].sampling.seeded().seed
    return [replace(r, sampling=replace(r.sampling, seed=seed)) for r in requests]


@dataclass(kw_only=True)
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
    source: Source | None = None  # where this step's draft came from; None: no draft


@dataclass
class MemoryParts:
    main_weights: int
    draft_weights: int
    main_kv: int
    draft_kv: int
    # what llama.cpp holds for each model per device ("host", or a GPU's name such as CUDA0): bytes of its
    # weights, kv, compute and output buffers (LoadedModel.on_devices); empty where not known
    main_held: dict[str, dict[str, int]] = field(default_factory=dict)
    draft_held: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def draft_total(self) -> int:
        """What the draft model costs in memory: its weights and its KV cache."""
        return self.draft_weights + self.draft_kv

    def per_device(self) -> dict[str, tuple[int, int]]:
        """Bytes held on each device, every buffer counted: (the main model's, the draft model's)."""
        names = list(dict.fromkeys([*self.main_held, *self.draft_held]))
        return {n: (sum(self.main_held.get(n, {}).values()), sum(self.draft_held.get(n, {}).values())) for n in names}


def e2e_speedup(n_generated: int, t_total: float, plain_t_prompt: float, plain_decode_tps: float) -> float | None:
    """End-to-end speedup over plain decoding of the same prompt: the seconds plain takes for an answer of this
    length (its prompt processing, then n tokens at its decode rate) over the seconds this answer took. For
    answers of equal length that is the ratio of total times; an answer that comes out shorter or longer (greedy
    outputs part at near ties) is then neither favoured nor penalised by the prompt time it shares out."""
    if t_total <= 0 or plain_decode_tps <= 0:
        return None
    return (plain_t_prompt + n_generated / plain_decode_tps) / t_total


@dataclass
class GenerationResult:
    mode: str
    text: str
    tokens: list[int]
    from_draft: list[bool]
    stop_reason: str  # eos | stop | length | context | cancelled
    n_prompt: int
    n_prompt_cached: int
    t_prompt: float  # prompt processing: the main model's, and the draft model's whenever it read the prompt
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
    dropped_turns: int = 0  # oldest chat turns left out so that the prompt fits (`fit_context`)
    seed: int = 0  # the sampling seed used (drawn at random when the request's was -1)
    step_sources: list[Source | None] = field(default_factory=list)  # per step (as `steps`): its draft's source
    store: dict | None = None  # the suffix store after this generation: generations, tokens, bytes, added
    # prompt tokens the draft model processed (in the prompt phase, or mid-answer where auto brought it in later),
    # and the seconds that took, counted in t_prompt either way (not in t_decode); 0 where no draft model read any
    draft_prompt_tokens: int = 0
    t_draft_prompt: float = 0.0

    @property
    def t_total(self) -> float:
        """End to end: prompt processing (the draft model's own included) plus decoding."""
        return self.t_prompt + self.t_decode

    @property
    def e2e_tps(self) -> float:
        """Generated tokens per second end to end: what a user waits for."""
        return self.n_generated / self.t_total if self.t_total > 0 else 0.0

    def e2e_speedup_over(self, plain: GenerationResult) -> float | None:
        """End-to-end speedup over `plain` on the same prompt (`e2e_speedup`)."""
        return e2e_speedup(self.n_generated, self.t_total, plain.t_prompt, plain.decode_tps)

    def to_dict(self, steps: bool = False, tokens: bool = True) -> dict:
        d = asdict(self)
        if not steps:
            d.pop("steps")
            d.pop("step_sources")
        if not tokens:
            d.pop("tokens")
            d.pop("from_draft")
        return d
