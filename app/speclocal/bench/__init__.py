"""`speclocal bench`: plain vs speculative methods over a prompt suite, per task category.

Modules: `suite` (questions: built-in or Spec-Bench format), `runner` (methods, the measurement loop),
`metrics` (raw records -> report numbers), `report` (json/csv/markdown), `plots` (PNG), `machine`
(machine and model facts), `cli` (`add_arguments`, `run`), `build_suite` (regenerates the data file).
"""

from speclocal.bench.cli import add_arguments, run

__all__ = ["add_arguments", "run"]
