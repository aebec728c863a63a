"""Task types of a prompt (code, edit, json, chat, creative): what auto mode's priors and the
history tables are keyed by. Pure text heuristics; no engine imports, so front ends load fast."""

from __future__ import annotations

import re

TASKS = ("code", "edit", "json", "chat", "creative")


def detect_task(text: str) -> str:
    """A coarse task type from the prompt text."""
    low = text.lower()
    has_code = "```" in text or bool(re.search(r"^\s*(def |class |function |import |#include|public |const )", text, re.M))
    if has_code and re.search(r"\b(refactor|rename|add|fix|rewrite|return the (whole|full|complete)|modify|change|edit|convert)\b", low):
        return "edit"
    if re.search(r"\breturn the (whole|full|complete)( updated)? (file|module|script|function|class|code)\b", low):
        return "edit"  # a later turn of an editing session: the code is in the conversation, not in this message
    if "json" in low or re.search(r"\bextract\b", low):
        return "json"
    if has_code or re.search(r"\b(code|function|python|javascript|typescript|rust|java|c\+\+|sql|script|class|regex|implement)\b", low):
        return "code"
    if re.search(r"\b(story|poem|write a|lyrics|essay|creative|imagine|haiku)\b", low):
        return "creative"
    return "chat"
