"""The model catalogue (`models.toml`) and the one resolver other code uses to find model files."""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from speclocal.errors import SpeclocalError
from speclocal.locations import catalogue_path, models_dir


@dataclass(frozen=True)
class MirrorPart:
    """One PyPI wheel carrying a piece of a model file, and the member path inside it."""

    package: str
    version: str
    path: str


@dataclass(frozen=True)
class ModelEntry:
    id: str
    repo: str
    file: str
    size: int  # 0 when unknown: recorded on first download
    sha256: str  # "" when unknown: recorded on first download
    quant: str
    params: str
    family: str
    license: str
    mirror: tuple[MirrorPart, ...] = field(default_factory=tuple)


@dataclass(frozen=True)
class PairEntry:
    id: str
    main: str
    draft: str
    note: str
    ram_gb: float
    ram_ctx: int


@dataclass(frozen=True)
class Catalogue:
    models: dict[str, ModelEntry]
    pairs: dict[str, PairEntry]
    default_pair: str

    def model(self, model_id: str) -> ModelEntry:
        try:
            return self.models[model_id]
        except KeyError:
            raise SpeclocalError(f"unknown model id {model_id!r} (see `speclocal models`)") from None

    def pair(self, pair_id: str) -> PairEntry:
        try:
            return self.pairs[pair_id]
        except KeyError:
            raise SpeclocalError(f"unknown pair id {pair_id!r} (see `speclocal models`)") from None

    def expand(self, names: list[str]) -> list[ModelEntry]:
        """Model entries for pair or model ids, in order, without repeats."""
        out: list[ModelEntry] = []
        for name in names:
            if name in self.pairs:
                p = self.pairs[name]
                entries = [self.model(p.main), self.model(p.draft)]
            elif name in self.models:
                entries = [self.models[name]]
            else:
                raise SpeclocalError(f"unknown pair or model id {name!r} (see `speclocal models`)")
            out.extend(e for e in entries if e not in out)
        return out


@lru_cache(maxsize=4)
def _load(path: Path) -> Catalogue:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise SpeclocalError(f"cannot read model catalogue {path}: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise SpeclocalError(f"model catalogue {path} is not valid TOML: {e}") from None
    try:
        models = {}
        for m in data.get("model", []):
            mirror = tuple(MirrorPart(p["package"], p["version"], p["path"]) for p in m.get("mirror", []))
            fields = {k: m[k] for k in ("id", "repo", "file", "quant", "params", "family", "license")}
            models[m["id"]] = ModelEntry(**fields, size=int(m.get("size", 0)), sha256=m.get("sha256", ""), mirror=mirror)
        pairs = {
            p["id"]: PairEntry(p["id"], p["main"], p["draft"], p["note"], float(p["ram_gb"]), int(p["ram_ctx"]))
            for p in data.get("pair", [])
        }
        cat = Catalogue(models, pairs, data["default_pair"])
    except (KeyError, TypeError, ValueError) as e:
        raise SpeclocalError(f"model catalogue {path} is malformed: {e}") from None
    for p in pairs.values():
        cat.model(p.main), cat.model(p.draft)
    cat.pair(cat.default_pair)
    return cat


def load_catalogue(path: Path | None = None) -> Catalogue:
    return _load((path or catalogue_path()).resolve())


def resolve_model(spec: str, directory: str | os.PathLike | None = None) -> Path:
    """A model argument (a path to a .gguf file, or a catalogue id) -> the path of an existing file."""
    cat = load_catalogue()
    if spec in cat.models:
        path = models_dir(directory) / cat.models[spec].file
        if not path.is_file():
            raise SpeclocalError(f"model {spec!r} is not downloaded ({path}); run `speclocal fetch {spec}`")
        return path
    path = Path(spec).expanduser()
    if path.is_file():
        return path
    if path.suffix.lower() == ".gguf" or os.sep in spec:
        raise SpeclocalError(f"model file not found: {spec}")
    raise SpeclocalError(f"unknown model {spec!r}: not a catalogue id and not a file (see `speclocal models`)")


def names_draft(pair: str | None, main: str | None, draft: str | None) -> bool:
    """Whether model flags give a draft model: -md, or a pair (--pair, or the default one when -m is not given);
    -m alone means the main model alone."""
    return bool(draft or pair or not main)


def resolve_pair(pair: str | None = None, main: str | None = None, draft: str | None = None,
                 directory: str | os.PathLike | None = None) -> tuple[Path, Path | None]:
    """(main path, draft path) from a pair id and/or explicit -m/-md overrides."""
    cat = load_catalogue()
    p = cat.pair(pair or cat.default_pair)
    main_path = resolve_model(main or p.main, directory)
    if not names_draft(pair, main, draft):
        return main_path, None
    return main_path, resolve_model(draft or p.draft, directory)
