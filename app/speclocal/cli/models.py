"""`speclocal models`: the catalogue's pairs and models, with local status."""

from __future__ import annotations

import argparse
import json

from speclocal.locations import models_dir
from speclocal.models.catalogue import load_catalogue
from speclocal.models.fetch import local_status
from speclocal.formatting import fmt_bytes, text_table
from speclocal.options import add_options


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_options(p, "models", ("models_dir",))
    p.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    cat, dest = load_catalogue(), models_dir(args.models_dir)
    pairs = [{"id": p.id, "default": p.id == cat.default_pair, "main": p.main, "draft": p.draft,
              "ram_gb": p.ram_gb, "ram_ctx": p.ram_ctx, "note": p.note} for p in cat.pairs.values()]
    models = []
    for m in cat.models.values():
        path = dest / m.file
        size = m.size or (path.stat().st_size if path.is_file() else None)
        models.append({"id": m.id, "quant": m.quant, "params": m.params, "size": size,
                       "status": local_status(m, dest), "path": str(path), "mirror": bool(m.mirror),
                       "repo": m.repo, "file": m.file, "family": m.family, "license": m.license})

    if args.json:
        print(json.dumps({"dir": str(dest), "default_pair": cat.default_pair, "pairs": pairs, "models": models}, indent=2))
        return 0
    print(text_table(["pair", "main", "draft", "RAM", "note"], [
        [("* " if p["default"] else "  ") + p["id"], p["main"], p["draft"], f"{p['ram_gb']:.1f} GB @ {p['ram_ctx']}", p["note"]]
        for p in pairs
    ]))
    print("(* default pair; RAM = weights + both KV caches + compute buffers at that context)")
    print()
    print(text_table(["model", "quant", "params", "size", "local", "mirror", "hub repo"], [
        [m["id"], m["quant"], m["params"], fmt_bytes(m["size"], binary=True) if m["size"] else "?", m["status"],
         "yes" if m["mirror"] else "no", m["repo"]]
        for m in models
    ]))
    print(f"models dir: {dest}")
    return 0
