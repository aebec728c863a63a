"""The bench's questions selected: by category and count, and the stability prompts (read by `speclocal.suite`)."""

from __future__ import annotations

from speclocal.errors import SpeclocalError
from speclocal.suite import Question

STABILITY_CATEGORY = "stability"  # built-in long-generation prompts; not a task category
LONG_CONTEXT = "long-context"
MULTI_TURN = "multi-turn"
EDITING_SESSION = "editing-session"  # one file edited turn after turn, the whole file back each time


def categories_of(questions: list[Question]) -> list[str]:
    """Task categories in the order of first appearance (the stability prompts are not one)."""
    out: list[str] = []
    for q in questions:
        if q.category != STABILITY_CATEGORY and q.category not in out:
            out.append(q.category)
    return out


def parse_list(text: str | None) -> list[str] | None:
    if text is None:
        return None
    items = [x.strip() for x in text.split(",") if x.strip()]
    return items or None


def select(questions: list[Question], categories: list[str] | None, per_category: int | None,
           caps: dict[str, int] | None = None) -> list[Question]:
    """The task questions to run, grouped by category in suite order; unknown categories are an error.
    `caps`: a lower limit for some categories (the quick run takes one long-context prompt)."""
    known = categories_of(questions)
    if categories:
        unknown = [c for c in categories if c not in known]
        if unknown:
            raise SpeclocalError(f"unknown categor{'y' if len(unknown) == 1 else 'ies'} "
                                 f"{', '.join(repr(c) for c in unknown)} (choose from {', '.join(known)})")
        wanted = list(dict.fromkeys(categories))
    else:
        wanted = known
    out: list[Question] = []
    for cat in wanted:
        limit = per_category
        if caps and cat in caps:
            limit = caps[cat] if limit is None else min(limit, caps[cat])
        qs = [q for q in questions if q.category == cat]
        out.extend(qs[:limit] if limit is not None else qs)
    return out


def stability_questions(questions: list[Question]) -> list[Question]:
    return [q for q in questions if q.category == STABILITY_CATEGORY and q.stability]
