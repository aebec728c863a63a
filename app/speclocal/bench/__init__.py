"""`speclocal bench`'s library: plain vs speculative methods over a prompt suite, per task category.

Modules: `suite` (questions: built-in or Spec-Bench format), `runner` (methods, the measurement loop),
`session` (a bench from plan to written report), `metrics` (raw records -> report numbers), `report`
(json/csv/markdown; `python -m speclocal.bench.report DIR` re-renders a report from its results.json),
`plots` (PNG), `machine` (machine and model facts); the built-in suite is the data file
`speclocal/data/suite.jsonl`. The command is `speclocal.cli.bench`.
"""
