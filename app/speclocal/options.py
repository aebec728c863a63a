"""Command-line options shared by every front end that loads models (llama.cpp's flag names)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from speclocal.engine import DraftParams, Engine, GenerationRequest, Sampling
from speclocal.errors import SpeclocalError
from speclocal.models.catalogue import resolve_pair


def add_model_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("models")
    g.add_argument("--pair", help="catalogue pair id (default: the catalogue's default pair)")
    g.add_argument("-m", "--model", help="main model: GGUF path or catalogue id (overrides the pair's)")
    g.add_argument("-md", "--model-draft", help="draft model: GGUF path or catalogue id (overrides the pair's)")
    g.add_argument("--dir", help="models directory (default: $SPECLOCAL_MODELS or the user cache dir)")
    g.add_argument("-c", "--ctx-size", type=int, default=4096, help="context size in tokens (default 4096)")
    g.add_argument("-t", "--threads", type=int, default=None, help="threads (default: physical cores)")
    g.add_argument("-ngl", "--n-gpu-layers", type=int, default=0, help="layers to offload to a GPU (default 0)")
    g.add_argument("--force", action="store_true", help="load even if the memory estimate exceeds available RAM")


def add_generation_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("generation")
    g.add_argument("-n", "--n-predict", type=int, default=256, help="tokens to generate at most (default 256)")
    g.add_argument("--temp", type=float, default=0.0, help="temperature; 0 = greedy (default 0)")
    g.add_argument("--top-k", type=int, default=40)
    g.add_argument("--top-p", type=float, default=0.95)
    g.add_argument("--min-p", type=float, default=0.05)
    g.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    g.add_argument("--draft-max", type=int, default=3, help="tokens to draft per step (default 3)")
    g.add_argument("--draft-min", type=int, default=0, help="drop drafts shorter than this (default 0)")
    g.add_argument("--draft-p-min", type=float, default=0.0,
                   help="stop drafting when the draft's top probability is below this (default 0)")
    g.add_argument("--system", help="system prompt")
    g.add_argument("--raw", action="store_true", help="raw completion: no chat template")
    g.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")


def engine_from_args(args: argparse.Namespace, need_draft: bool = True) -> Engine:
    main, draft = resolve_pair(args.pair, args.model, args.model_draft, args.dir)
    if args.threads is not None and args.threads < 1:
        raise SpeclocalError(f"-t/--threads must be >= 1, got {args.threads}")
    return Engine(main, draft if need_draft else None, n_ctx=args.ctx_size, n_threads=args.threads,
                  n_gpu_layers=args.n_gpu_layers, force=args.force)


def read_prompt(arg: str) -> str:
    """PROMPT as given, '-' for standard input, '@FILE' for a file's text."""
    if arg == "-":
        return sys.stdin.read()
    if arg.startswith("@"):
        try:
            return Path(arg[1:]).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise SpeclocalError(f"cannot read prompt file {arg[1:]}: {e}") from None
    return arg


def request_from_args(args: argparse.Namespace, prompt: str, mode: str) -> GenerationRequest:
    sampling = Sampling(temp=args.temp, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p, seed=args.seed)
    draft = DraftParams(max=args.draft_max, min=args.draft_min, p_min=args.draft_p_min)
    if args.raw:
        return GenerationRequest(prompt=prompt, mode=mode, n_predict=args.n_predict, sampling=sampling,
                                 draft=draft, stop=tuple(args.stop))
    messages = ([{"role": "system", "content": args.system}] if args.system else []) + [
        {"role": "user", "content": prompt}
    ]
    return GenerationRequest(messages=tuple(messages), mode=mode, n_predict=args.n_predict, sampling=sampling,
                             draft=draft, stop=tuple(args.stop))
