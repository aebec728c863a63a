"""`speclocal inspect MAIN [DRAFT]`: GGUF facts, pair compatibility and a memory estimate, no weights loaded."""

from __future__ import annotations

import argparse
import json

from speclocal.formatting import fmt_bytes, text_table
from speclocal.models.catalogue import resolve_model
from speclocal.models.gguf_info import GGUFInfo
from speclocal.models.layout import DESCRIPTIONS, known
from speclocal.models.plan import check_load
from speclocal.options import add_options, settings_from_args


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("main", metavar="MAIN", help="main model: a .gguf path or a catalogue id")
    p.add_argument("draft", metavar="DRAFT", nargs="?", help="draft model: a .gguf path or a catalogue id")
    add_options(p, "models", ("ctx_size", "models_dir", "n_gpu_layers"))
    p.add_argument("--json", action="store_true", help="print one JSON object")


def human_count(n: int) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.0f} M"


def _rows(m: GGUFInfo) -> list[tuple[str, str]]:
    mix = ", ".join(f"{t} {b / m.tensor_bytes:.0%}" for t, b in m.tensor_types.items() if b >= 0.01 * m.tensor_bytes)
    return [
        ("file", m.path.name),
        ("name", m.name),
        ("architecture", m.architecture),
        ("parameters", human_count(m.n_params)),
        ("quantization", f"{m.quantization} ({mix})"),
        ("file size", fmt_bytes(m.file_size, binary=True)),
        ("context length", f"{m.context_length:,}"),
        ("layers", str(m.n_layer)),
        ("heads / KV heads", f"{m.n_head} / {m.n_head_kv}"),
        ("embd / head dim", f"{m.n_embd} / {m.head_dim_k}" + (f"+{m.head_dim_v}" if m.head_dim_v != m.head_dim_k else "")),
        ("tokenizer", f"{m.tokenizer_model} ({m.vocab_type}, pre {m.tokenizer_pre or '-'})"),
        ("vocab size", f"{m.vocab_size:,}"),
        ("BOS", f"{m.bos_id} {m.token_text(m.bos_id)!r}" + (" (added)" if m.add_bos else "")),
        ("EOS", f"{m.eos_id} {m.token_text(m.eos_id)!r}" + (" (added)" if m.add_eos else "")),
        ("chat template", "yes" if m.has_chat_template else "no"),
    ]


def run(args: argparse.Namespace) -> int:
    s = settings_from_args(args)
    check = check_load(resolve_model(args.main, s.models_dir),
                       resolve_model(args.draft, s.models_dir) if args.draft else None, s.ctx_size, s.n_gpu_layers)
    infos = {"main": check.main, **({"draft": check.draft} if check.draft else {})}
    compat, mem, pools = check.compat, check.memory, check.pools
    layout = known([m.path for m in infos.values()], check.compute)

    if args.json:
        print(json.dumps({
            "models": {role: m.to_dict() for role, m in infos.items()},
            "compat": None if compat is None else {"ok": compat.ok, "rule": compat.rule, "detail": compat.detail,
                                                   "notes": list(compat.notes)},
            "memory": mem.to_dict(),
            "compute": check.compute,
            "layout": layout,  # the weight layout a load would use (None: a test decode decides at the first load)
            "pools": [vars(p) for p in pools],
        }, indent=2))
        return 0

    cols = {role: _rows(m) for role, m in infos.items()}
    rows = [[label, *(cols[r][i][1] for r in cols)] for i, (label, _) in enumerate(cols["main"])]
    print(text_table(["", *cols], rows))
    print()
    if compat is not None:
        print(f"compatibility: {'✓ compatible' if compat.ok else '✗ incompatible'} ({compat.detail})")
        for note in compat.notes:
            print(f"  note: {note}")
        print()
    _print_memory(mem)
    print("weight layout: " + (f"{DESCRIPTIONS[layout]} (what survived a test decode on this machine)" if layout else
                               "decided at the first load, by a test decode of each layout in a child process"))
    print(f"computing on {check.compute} (-ngl {s.n_gpu_layers}); memory checked:")
    for p in pools:
        have = "the backend does not say" if p.available is None else f"{fmt_bytes(p.available, binary=True)} available"
        print(f"  {p.pool}: needs {fmt_bytes(p.need, binary=True)}, {have} -> {'fits' if p.fits else 'does not fit'}"
              + (f" ({p.note})" if p.note else ""))
    return 0


def _print_memory(mem) -> None:
    """The estimate per model and in all, and this machine's verdict on it."""
    mem_rows = [[m.role, *(fmt_bytes(n, binary=True) for n in (m.weights, m.kv_cache, m.compute, m.total))]
                for m in mem.models]
    mem_rows.append(["total", "", "", "", fmt_bytes(mem.total, binary=True)])
    print(f"memory at context {mem.n_ctx} (n_ubatch {mem.n_ubatch}, f16 KV cache):")
    print(text_table(["", "weights", "KV cache", "compute", "total"], mem_rows))
    print(f"compute allowance: {mem.compute_formula}")
    print(f"weights: {mem.weights_note}")
    print(f"this machine: {fmt_bytes(mem.ram_total, binary=True)} RAM, {fmt_bytes(mem.ram_available, binary=True)} "
          f"available -> {mem.verdict}  ({mem.rule})")
