"""Compose a bench question file from prompts that are not in the built-in suite.

    python scripts/external_questions.py SPEC_BENCH_QUESTION_JSONL HUMANEVAL_JSONL[.gz] > questions.jsonl
    speclocal bench --questions questions.jsonl -n 64 --no-bracket

Takes the first --per-category questions (first turn only) of each Spec-Bench category named in
--categories, and the first --n-humaneval HumanEval problems as a "humaneval" category. The files come from
github.com/hemingkx/Spec-Bench (data/spec_bench/question.jsonl) and github.com/openai/human-eval
(data/HumanEval.jsonl.gz); they are not shipped here.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

CATEGORIES = "translation,summarization,qa,math_reasoning,rag,writing,roleplay,coding,extraction"


def read_jsonl(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def compose(spec_bench: list[dict], humaneval: list[dict], categories: list[str], per_category: int,
            n_humaneval: int) -> list[dict]:
    out: list[dict] = []
    for category in categories:
        rows = [r for r in spec_bench if r["category"] == category][:per_category]
        if not rows:
            raise SystemExit(f"no Spec-Bench questions in category {category!r}")
        out += [{"question_id": f"sb-{r['question_id']}", "category": category, "turns": r["turns"][:1]}
                for r in rows]
    for problem in humaneval[:n_humaneval]:
        turn = f"Complete this Python function.\n\n```python\n{problem['prompt']}```"
        out.append({"question_id": problem["task_id"].replace("/", "-").lower(), "category": "humaneval",
                    "turns": [turn]})
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("spec_bench", type=Path, help="Spec-Bench data/spec_bench/question.jsonl")
    p.add_argument("humaneval", type=Path, help="HumanEval data/HumanEval.jsonl(.gz)")
    p.add_argument("--categories", default=CATEGORIES, help=f"Spec-Bench categories (default {CATEGORIES})")
    p.add_argument("--per-category", type=int, default=2, help="questions per category (default 2)")
    p.add_argument("--n-humaneval", type=int, default=8, help="HumanEval problems (default 8)")
    a = p.parse_args()
    try:
        rows = compose(read_jsonl(a.spec_bench), read_jsonl(a.humaneval), a.categories.split(","),
                       a.per_category, a.n_humaneval)
    except (OSError, ValueError, KeyError) as e:
        raise SystemExit(f"cannot compose questions: {e}") from None
    for row in rows:
        sys.stdout.write(json.dumps(row, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
