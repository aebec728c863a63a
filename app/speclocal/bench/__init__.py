"""`speclocal bench`: plain vs speculative methods over a prompt suite, per task category.

Modules: `suite` (questions: built-in or Spec-Bench format), `runner` (methods, the measurement loop),
`metrics` (raw records -> report numbers), `report` (json/csv/markdown; `python -m speclocal.bench.report
DIR` re-renders a report from its results.json), `plots` (PNG), `machine` (machine and model facts),
`cli` (the command); the built-in suite is the data file `speclocal/data/suite.jsonl`.
"""

from __future__ import annotations


def add_arguments(parser) -> None:
    from speclocal.bench.cli import add_arguments as _add

    _add(parser)


def run(args) -> int:
    from speclocal.bench.cli import run as _run

    return _run(args)


__all__ = ["add_arguments", "run"]
