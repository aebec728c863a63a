"""Draft candidates without the hub: the tiny pair's models requantized by llama.cpp's own quantizer.

    python scripts/make_drafts.py [--dir DIR] [--threads N] [MODEL:TYPE ...]

Default: the 0.5B draft at Q8_0 and at Q2_K, and the 1.5B main at Q2_K (a self-draft), each from its Q4_K_M
file (requantized: allow_requantize), written once into the models dir as `<stem>.requant-<type>.gguf`;
a file already there is reused. Prints each file, its size and the seconds it took. `speclocal drafts`
then finds them as candidates beside the catalogue's.
"""

from __future__ import annotations

import argparse

from speclocal.engine.quantize import requantize
from speclocal.formatting import fmt_bytes
from speclocal.models.catalogue import resolve_model

DEFAULT = ("qwen2.5-coder-0.5b-q4km:Q8_0", "qwen2.5-coder-0.5b-q4km:Q2_K", "qwen2.5-coder-1.5b-q4km:Q2_K")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("targets", nargs="*", default=DEFAULT, metavar="MODEL:TYPE",
                   help="a catalogue id or GGUF path and the type to requantize it to")
    p.add_argument("--dir", help="models directory (default: $SPECLOCAL_MODELS or the user cache dir)")
    p.add_argument("--threads", type=int, default=0, help="quantizer threads (0: every core)")
    args = p.parse_args()
    for target in args.targets:
        spec, _, qtype = target.rpartition(":")
        path, seconds = requantize(resolve_model(spec, args.dir), qtype, args.dir, args.threads)
        how = f"made in {seconds:.1f} s" if seconds else "already there"
        print(f"{path.name}: {fmt_bytes(path.stat().st_size, binary=True)}, {how}", flush=True)


if __name__ == "__main__":
    main()
