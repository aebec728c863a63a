"""Every setting, declared once: name, llama.cpp-style flags, type, default, allowed values, help, TUI label,
and whether and as what it reaches the model loader.

`Settings` declares them, one field each (`option`); `OPTIONS` reads the declarations back. The command-line
parsers (`add_options`), the TUI's settings file and screen, the engine's `Sampling`, `DraftParams` and
`GenerationRequest` defaults, the engine's load keywords (`load_args`), what makes the TUI load again
(`load_key`), bench and profile all read these declarations; none repeats a default or a range. Pure: no
llama.cpp, no Textual.

Flags are added with the default `None`, so a front end can tell a flag the user typed from one left
alone: `settings_from_args` lays typed flags over a base (the declared defaults, or the TUI's saved
settings).
"""

from __future__ import annotations

import argparse
import math
import types
import typing
from dataclasses import dataclass, fields, replace
from dataclasses import field as dc_field
from typing import Any, Callable

from speclocal.drafts import CHOOSABLE, Source
from speclocal.errors import SpeclocalError
from speclocal.tasks import TASKS

DRAFT_SOURCES = (*CHOOSABLE, "none")
ORDERS = ("alternate", "plain-first", "spec-first")


@dataclass(frozen=True)
class Option:
    """One setting. `flags` empty: not on the command line; `label` None: not on the TUI's settings screen;
    `saved`: kept in the TUI's settings file; `load`: the Engine keyword it is passed as (None: not passed);
    `reload`: a change to it needs the models loaded again."""

    name: str
    type: type
    default: Any
    help: str
    flags: tuple[str, ...] = ()
    group: str = "generation"  # models | generation | mode | tui
    label: str | None = None
    saved: bool = True
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] | None = None
    choice_labels: tuple[str, ...] | None = None  # how the TUI names each choice
    check: Callable[[Any], str | None] | None = None  # a rule the bounds cannot say: returns what is wrong
    metavar: str | None = None
    load: str | None = None
    reload: bool = False


    @property
    def flag_name(self) -> str:
        return "/".join(self.flags) or self.name

    def problem(self, value: Any, name: str | None = None) -> str | None:
        """What is wrong with `value` for this setting, as a sentence naming it (`name`, default its flags)."""
        name = name or self.flag_name
        if self.choices is not None and value not in self.choices:
            return f"{name} must be one of {', '.join(self.choices)}, got {value!r}"
        if isinstance(value, float) and not math.isfinite(value):  # nan passes every comparison below
            return f"{name} must be a finite number, got {value:g}"
        if self.minimum is not None and value < self.minimum:
            return f"{name} must be >= {self.minimum:g}, got {value:g}"
        if self.maximum is not None and value > self.maximum:
            return f"{name} must be <= {self.maximum:g}, got {value:g}"
        if self.check is not None and (why := self.check(value)) is not None:
            return f"{name} must be {why}, got {value!r}" if isinstance(value, str) else f"{name} must be {why}, got {value:g}"
        return None


def _gpu_layers(x: str) -> str | None:
    return None if x in ("auto", "all") or (x.isdigit()) else "a number >= 0, 'auto' or 'all'"


def _open_unit(x: float) -> str | None:
    return None if 0 < x <= 1 else "in (0, 1]"


def _unit(x: float) -> str | None:
    return None if 0 <= x < 1 else "in [0, 1)"


def _mode_help() -> str:
    """Each mode with what it drafts from."""
    return "; ".join(s.mode if s.about == s.mode else f"{s.mode}: {s.about.removeprefix(s.mode + ': ')}"
                     for s in Source if s.mode)


def option(default: Any, help: str, flags: tuple[str, ...] = (), group: str = "generation", *,
           label: str | None = None, saved: bool = True, minimum: float | None = None,
           maximum: float | None = None, choices: tuple[str, ...] | None = None,
           choice_labels: tuple[str, ...] | None = None, check: Callable[[Any], str | None] | None = None,
           metavar: str | None = None, load: str | None = None, reload: bool | None = None) -> Any:
    """A `Settings` field declaring one setting (see `Option`; its name and type are the field's). `reload`
    defaults to whether the setting is loaded."""
    spec = Option("", object, default, help, flags, group, label, saved, minimum, maximum, choices, choice_labels,
                  check, metavar, load, load is not None if reload is None else reload)
    return dc_field(default=default, metadata={"option": spec})


@dataclass(frozen=True)
class Settings:
    """A value for every setting, each field declaring its setting once (defaults: the declared ones)."""

    # ---- models ----
    pair: str = option("", "catalogue pair id (default: the catalogue's default pair)", ("--pair",), "models",
                       label="Pair", metavar="ID", reload=True)
    main: str = option("", "main model: GGUF path or catalogue id (overrides the pair's)", ("-m", "--model"),
                       "models", label="Main model", metavar="MODEL", reload=True)
    draft: str = option("", "draft model: GGUF path or catalogue id (overrides the pair's)",
                        ("-md", "--model-draft"), "models", label="Draft model", metavar="MODEL", reload=True)
    models_dir: str = option("", "models directory (default: $SPECLOCAL_MODELS or the user cache dir)", ("--dir",),
                             "models", saved=False, metavar="DIR", reload=True)
    ctx_size: int = option(4096, "context size in tokens", ("-c", "--ctx-size"), "models",
                           label="Context (tokens)", minimum=16, metavar="N", load="n_ctx")
    threads: int = option(0, "threads; 0 = one per physical core", ("-t", "--threads"), "models",
                          label="Threads (0 = auto)", minimum=0, metavar="N", load="n_threads")
    n_gpu_layers: str = option("auto", "layers to offload to a GPU: a number, 'all', or 'auto' = all where this "
                               "llama.cpp build can offload, else none (0 forces the CPU)", ("-ngl", "--n-gpu-layers"),
                               "models", label="GPU layers (auto/all/N)", check=_gpu_layers, metavar="N",
                               load="n_gpu_layers")
    repack: bool | None = option(None, "--repack: llama.cpp's default weight layout (repacked for this CPU's "
                                 "kernels: AMX or CPU_REPACK); --no-repack: the weights as stored; neither: the first "
                                 "layout that survives a test decode on this machine, tried once in a child process "
                                 "(llama.cpp's default, then CPU_REPACK without AMX, then as stored) and cached",
                                 ("--repack",), "models", saved=False, load="repack")
    backend_sampling: bool | None = option(
        None, "-bs/--backend-sampling: each output row's top-k selected by llama.cpp on the device, so only those "
        "candidates reach Python (llama.cpp's backend sampling; the draft model's too); --no-backend-sampling: "
        "every row's logits copied to the host and sampled there; neither: on where every layer runs on a GPU",
        ("-bs", "--backend-sampling"), "models", saved=False, load="backend_sampling")
    force: bool = option(False, "load even if the memory estimate exceeds available RAM", ("--force",), "models",
                         saved=False, load="force", reload=False)
    # ---- generation (the order of the TUI's settings screen) ----
    draft_source: str = option("model", "where the speculative run's drafts come from", group="tui",
                               label="Draft source", choices=DRAFT_SOURCES,
                               choice_labels=(*(s.about for s in CHOOSABLE), "none: plain only"))
    # draft-max/min/p-min: the pinned llama.cpp's own draft defaults (common_params_speculative: 3, 0, 0.0;
    # releases before it used 16 and 0.75); lookup-max: model-free drafts cost next to nothing, so longer
    draft_max: int = option(3, "draft-model tokens per step at most (auto too)", ("--draft-max",),
                            label="Draft max (k)", minimum=1, maximum=64, metavar="K")
    lookup_max: int = option(16, "model-free draft tokens (prompt lookup, suffix) per step at most (auto too)",
                             ("--lookup-max",), label="Lookup max (k)", minimum=1, maximum=64, metavar="K")
    draft_min: int = option(0, "drop drafts shorter than this", ("--draft-min",), label="Draft min", minimum=0,
                            metavar="K")
    draft_p_min: float = option(0.0, "draft model: stop drafting when its top probability is below this; suffix: "
                                "stop when a draft's cumulative empirical probability is below this (0 = the suffix "
                                "drafter's 0.1)", ("--draft-p-min",), label="Draft p-min", minimum=0, maximum=1,
                                metavar="P")
    store: bool = option(True, "suffix and auto modes remember each generation (prompt and output, per tokenizer, "
                         "in the user data dir) and draft from earlier ones; --no-store neither reads nor writes it",
                         ("--store",), label="Remember earlier outputs (suffix store)")
    temperature: float = option(0.0, "temperature; 0 = greedy", ("--temp",), label="Temperature (0 = greedy)",
                                minimum=0, metavar="T")
    top_k: int = option(40, "top-k sampling; 0 = off", ("--top-k",), saved=False, minimum=0, metavar="N")
    top_p: float = option(0.95, "top-p (nucleus) sampling", ("--top-p",), saved=False, check=_open_unit,
                          metavar="P")
    min_p: float = option(0.05, "min-p sampling", ("--min-p",), saved=False, check=_unit, metavar="P")
    seed: int = option(-1, "sampling seed; -1 = a new random one each run (recorded in the result)", ("--seed",),
                       label="Seed (-1 = random)", minimum=-1, metavar="N")
    n_predict: int = option(256, "tokens to generate at most", ("-n", "--n-predict"), label="Max tokens",
                            minimum=1, metavar="N")
    system_prompt: str = option("", "system prompt", ("--system",), label="System prompt", metavar="TEXT")
    raw: bool = option(False, "raw completion: no chat template", ("--raw",), saved=False)
    stop: tuple[str, ...] = option((), "stop string (repeatable)", ("--stop",), saved=False, metavar="TEXT")
    # ---- the mode of `run` and `serve` (each passes its own choices to add_options) ----
    mode: str = option("auto", _mode_help(), ("--mode",), "mode", saved=False)
    # ---- the TUI ----
    order: str = option("alternate", "which mode runs first", group="tui", label="Run order", choices=ORDERS,
                        choice_labels=("alternate", "plain first", "speculative first"))
    color_drafts: bool = option(True, "colour accepted draft tokens", group="tui", label="Colour accepted drafts")
    task: str = option("auto", "task type of the prompt (auto mode's prior); auto = detect", group="tui",
                       choices=("auto", *TASKS))

    def problems(self, style: str = "flag") -> list[str]:
        """What the user must fix, one sentence each (empty when usable); `style` "label" names settings as the
        TUI's settings screen does, "flag" by their command-line flags."""
        def name(o: Option) -> str | None:
            return o.label.lower() if style == "label" and o.label else None

        out = [why for o in OPTIONS if (why := o.problem(getattr(self, o.name), name(o))) is not None]
        if not out and self.draft_min > self.draft_max:
            out.append(f"{name(BY_NAME['draft_min']) or '--draft-min'} must be <= draft max ({self.draft_max}), "
                       f"got {self.draft_min}")
        return out

    def validated(self) -> "Settings":
        """These settings, or a SpeclocalError naming the first problem."""
        bad = self.problems()
        if bad:
            raise SpeclocalError(bad[0])
        return self


def _value_type(hint: Any) -> type:
    """The type a setting's value has, from its field's annotation: bool for `bool | None`, tuple for
    `tuple[str, ...]`."""
    if typing.get_origin(hint) is tuple:
        return tuple
    if isinstance(hint, types.UnionType):
        return next(a for a in typing.get_args(hint) if a is not type(None))
    return hint


_HINTS = typing.get_type_hints(Settings)
OPTIONS: tuple[Option, ...] = tuple(replace(f.metadata["option"], name=f.name, type=_value_type(_HINTS[f.name]))
                                    for f in fields(Settings))
BY_NAME: dict[str, Option] = {o.name: o for o in OPTIONS}


def default(name: str) -> Any:
    return BY_NAME[name].default


def check(name: str, value: Any, label: str | None = None) -> None:
    """Raise a one-line SpeclocalError if `value` is not allowed for setting `name`."""
    why = BY_NAME[name].problem(value, label)
    if why is not None:
        raise SpeclocalError(why)


def load_args(s: Settings) -> dict[str, Any]:
    """The Engine keywords `s` loads with (each setting declared with `load`)."""
    return {o.load: getattr(s, o.name) for o in OPTIONS if o.load}


def load_key(s: Settings) -> tuple:
    """The settings whose change needs the models loaded again (declared with `reload`)."""
    return tuple(getattr(s, o.name) for o in OPTIONS if o.reload)


def saved_fields() -> list[str]:
    return [o.name for o in OPTIONS if o.saved]


def add_options(parser: argparse.ArgumentParser, group: str, names: tuple[str, ...] | None = None,
                choices: tuple[str, ...] | None = None, **defaults_shown: Any) -> None:
    """Add the flags of every option in `group` (or only `names`) to `parser`, each with default None.
    `choices`: the values the command allows (its modes); `defaults_shown` overrides the default a help text
    states (a command with its own default)."""
    g = parser.add_argument_group(group)
    for o in OPTIONS:
        if o.group != group or not o.flags or (names is not None and o.name not in names):
            continue
        shown = defaults_shown.get(o.name, o.default)
        if o.type is bool and o.default is not False:  # --store / --no-store; --repack / --no-repack / neither
            g.add_argument(*o.flags, dest=o.name, action=argparse.BooleanOptionalAction, default=None,
                           help=o.help + (" (default on)" if o.default else ""))
        elif o.type is bool:
            g.add_argument(*o.flags, dest=o.name, action="store_true", default=None, help=o.help)
        elif o.type is tuple:
            g.add_argument(*o.flags, dest=o.name, action="append", default=None, metavar=o.metavar, help=o.help)
        else:
            tail = f" (default {shown})" if shown not in ("", None) else ""
            g.add_argument(*o.flags, dest=o.name, type=o.type, default=None, metavar=o.metavar, choices=choices,
                           help=o.help + tail)


def settings_from_args(args: argparse.Namespace | None, base: "Settings | None" = None, **overrides: Any) -> "Settings":
    """`base` (default: the declared defaults) with `overrides` and then every flag the user gave laid over it;
    validated (a SpeclocalError names the first problem)."""
    s = replace(base or Settings(), **overrides)
    if args is not None:
        given = {f.name: getattr(args, f.name) for f in fields(s) if getattr(args, f.name, None) is not None}
        if "stop" in given:
            given["stop"] = tuple(given["stop"])
        s = replace(s, **given)
    return s.validated()
