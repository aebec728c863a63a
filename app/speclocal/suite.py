"""Benchmark questions: the built-in suite (data/suite.jsonl) or a Spec-Bench `question.jsonl`, read and
validated (the one place either file is parsed: the bench selects from them, `speclocal drafts` takes prompts)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from speclocal.errors import SpeclocalError


@dataclass(frozen=True)
class Question:
    question_id: str
    category: str
    turns: tuple[str, ...]
    stability: str | None = None  # "code" | "chat" for the stability prompts of the built-in suite


def builtin_text() -> str:
    return resources.files("speclocal").joinpath("data/suite.jsonl").read_text(encoding="utf-8")


def parse_questions(text: str, source: str) -> list[Question]:
    """Spec-Bench's format: one JSON object per line with `question_id`, `category` and `turns`."""
    out: list[Question] = []
    seen: set[str] = set()
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{source} line {lineno}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise SpeclocalError(f"{where}: not valid JSON ({e.msg} at column {e.colno})") from None
        if not isinstance(row, dict):
            raise SpeclocalError(f"{where}: expected a JSON object with question_id, category and turns")
        turns = row.get("turns")
        if turns is None:
            raise SpeclocalError(f"{where}: missing 'turns' (a list of prompt strings)")
        if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t.strip() for t in turns):
            raise SpeclocalError(f"{where}: 'turns' must be a non-empty list of non-empty strings")
        category = row.get("category")
        if not isinstance(category, str) or not category.strip():
            raise SpeclocalError(f"{where}: missing 'category' (a non-empty string)")
        qid = row.get("question_id", lineno)
        if not isinstance(qid, (str, int)) or isinstance(qid, bool):
            raise SpeclocalError(f"{where}: 'question_id' must be a string or an integer")
        qid = str(qid)
        if qid in seen:
            raise SpeclocalError(f"{where}: duplicate question_id {qid!r}")
        seen.add(qid)
        stability = row.get("stability")
        out.append(Question(qid, category.strip(), tuple(turns), stability if isinstance(stability, str) else None))
    if not out:
        raise SpeclocalError(f"{source}: no questions in it")
    return out


def load_questions(path: str | None) -> list[Question]:
    """The built-in suite (path None) or a Spec-Bench-format file."""
    if path is None:
        return parse_questions(builtin_text(), "built-in suite")
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise SpeclocalError(f"cannot read questions file {path}: {e}") from None
    return parse_questions(text, str(path))
