"""Where drafted tokens come from: every drafter named once, with its label and the mode that runs it alone."""

from __future__ import annotations

from enum import StrEnum


class Source(StrEnum):
    """A drafter, by the name results use (`StepEvent.source`, auto's decisions, the cost model's keys), with
    its `label`, `mode` (`--mode`; None: no mode runs it alone) and `about` (the TUI's draft source setting)."""

    label: str
    mode: str | None
    about: str

    def __new__(cls, value: str, label: str, mode: str | None = None, about: str = "") -> "Source":
        member = str.__new__(cls, value)
        member._value_ = value
        member.label, member.mode, member.about = label, mode, about or label
        return member

    PLAIN = "plain", "plain", "plain"
    MODEL = "model", "draft model", "spec"
    LOOKUP = "lookup", "prompt lookup", "lookup", "prompt lookup (no model)"
    SUFFIX = "suffix", "suffix", "suffix", "suffix: the conversation and earlier outputs (no model)"
    AUTO = "auto", "auto", "auto", "auto: the engine decides per step"
    STORE = "store", "suffix (earlier outputs)"  # the suffix drafter, from its store of earlier generations
    COPY = "copy", "copy pointer"  # the suffix drafter's copy pointer (reported as SUFFIX)
    SYNTHETIC = "synthetic", "synthetic"  # benchmarks: a set acceptance rate

    @property
    def mode_label(self) -> str:
        """How a run of this drafter's mode is titled."""
        return self.label if self is Source.PLAIN else f"speculative · {self.label}"

    @property
    def reported(self) -> Source:
        """The source a step drafted by this one reports: the copy pointer's drafts are the suffix drafter's."""
        return Source.SUFFIX if self is Source.COPY else self

    @classmethod
    def of_mode(cls, mode: str) -> "Source":
        """The drafter that mode `mode` runs."""
        return next(s for s in cls if s.mode == mode)


MODES: tuple[str, ...] = tuple(s.mode for s in Source if s.mode)  # plain, spec, lookup, suffix, auto
CHOOSABLE = (Source.MODEL, Source.LOOKUP, Source.SUFFIX, Source.AUTO)  # the TUI's draft sources (beside none)
STORE_MODES = (Source.SUFFIX.mode, Source.AUTO.mode)  # the modes whose generations the suffix store keeps
DRAFT_MODEL_MODES = (Source.MODEL.mode, Source.AUTO.mode)  # the modes that run the draft model


def needs_draft_model(mode: str) -> bool:
    """Whether a run of `mode` uses the draft model (and so loads it, and pays its prompt processing)."""
    return mode in DRAFT_MODEL_MODES
