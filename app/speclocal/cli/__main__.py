"""`python -m speclocal.cli`: the installed `speclocal` command."""

import sys

from speclocal.cli import entry

sys.exit(entry())
