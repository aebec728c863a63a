"""`speclocal inspect` / `speclocal models` and gguf_info on the real GGUF files."""

from __future__ import annotations

import ctypes
import json
import re

import gguf
import pytest

from speclocal.cli import main
from speclocal.locations import models_dir
from speclocal.models.gguf_info import check_compat, estimate_memory, ram_verdict, read_gguf

MiB = 2**20


def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_tiny_pair_is_compatible(capsys, tiny_main, tiny_draft):
    rc, out, err = _cli(capsys, "inspect", str(tiny_main), str(tiny_draft), "-c", "4096")
    assert rc == 0 and err == ""
    assert "✓ compatible" in out
    assert re.search(r"vocab size\s+151,936\s+151,936", out)
    assert re.search(r"architecture\s+qwen2\s+qwen2", out)
    assert re.search(r"quantization\s+Q4_K_M .*Q4_K_M", out)
    main_info = read_gguf(tiny_main)
    assert (main_info.n_layer, main_info.n_head, main_info.n_head_kv, main_info.head_dim_k) == (28, 12, 2, 128)
    assert (main_info.bos_id, main_info.eos_id, main_info.add_bos) == (151643, 151645, False)
    assert read_gguf(tiny_main) is main_info  # cached by (path, size, mtime)


def test_smollm2_draft_is_incompatible_and_names_the_rule(capsys, tiny_main, smollm2):
    # both are gpt2/BPE with add_bos false, so llama.cpp's first failing rule is the vocab size difference
    rc, out, _ = _cli(capsys, "inspect", str(tiny_main), str(smollm2))
    assert rc == 0
    assert "✗ incompatible (n_vocab difference 102784 > 128: main 151936, draft 49152)" in out
    rc, out, _ = _cli(capsys, "inspect", str(tiny_main), str(smollm2), "--json")
    data = json.loads(out)
    assert data["compat"]["ok"] is False and data["compat"]["rule"] == "n_vocab"
    assert data["models"]["draft"]["vocab_type"] == data["models"]["main"]["vocab_type"] == "BPE"


@pytest.mark.models
def test_catalogue_ids_and_json(capsys):
    rc, out, _ = _cli(capsys, "inspect", "qwen2.5-coder-1.5b-q4km", "qwen2.5-coder-0.5b-q4km", "--json", "-c", "2048")
    data = json.loads(out)
    assert rc == 0 and data["compat"]["ok"] is True
    assert data["memory"]["n_ctx"] == 2048 and len(data["memory"]["models"]) == 2
    assert data["memory"]["verdict"] in ("fits", "tight", "does not fit")
    assert data["models"]["main"]["quantization"] == "Q4_K_M" and "tokens" not in data["models"]["main"]


def test_parser_agrees_with_gguf_reader(smollm2):
    info, ref = read_gguf(smollm2), gguf.GGUFReader(smollm2)
    tokens = ref.fields["tokenizer.ggml.tokens"]
    assert list(info.tokens) == [bytes(tokens.parts[i]) for i in tokens.data]
    assert info.n_params == sum(t.n_elements for t in ref.tensors)
    assert info.tensor_bytes == sum(t.n_bytes for t in ref.tensors)
    assert info.context_length == ref.fields["llama.context_length"].contents()
    assert info.n_head_kv == ref.fields["llama.attention.head_count_kv"].contents() == 3


def test_verdict_thresholds():
    assert ram_verdict(8, total=100, available=10) == "fits"
    assert ram_verdict(9, total=100, available=10) == "tight"
    assert ram_verdict(91, total=100, available=95) == "does not fit"


def _llama_cpp_buffers(paths, n_ctx: int) -> dict[str, float]:
    """Load the models with llama.cpp, in the weight layout speclocal loads them in here, and sum the buffer sizes
    (MiB) it logs, by kind."""
    import llama_cpp
    from llama_cpp._logger import llama_log_callback as default_callback

    from speclocal.models import layout
    from speclocal.models.devices import compute_label, devices

    chosen = layout.choose(list(paths), compute_label(0, devices()), 0, None).layout

    lines: list[str] = []
    callback = llama_cpp.llama_log_callback(lambda level, text, user: lines.append(text.decode("utf-8", "replace")))
    llama_cpp.llama_log_set(callback, ctypes.c_void_p(0))
    loaded = []
    try:
        for path in paths:
            params = llama_cpp.llama_model_default_params()
            params.n_gpu_layers = 0
            keep = layout.apply(params, chosen, path)
            model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
            del keep
            assert model, f"llama.cpp could not load {path}"
            cparams = llama_cpp.llama_context_default_params()
            cparams.n_ctx = n_ctx
            ctx = llama_cpp.llama_init_from_model(model, cparams)
            assert ctx
            loaded.append((model, ctx))
    finally:
        for model, ctx in loaded:
            llama_cpp.llama_free(ctx)
            llama_cpp.llama_model_free(model)
        llama_cpp.llama_log_set(default_callback, ctypes.c_void_p(0))
    sizes: dict[str, float] = {}
    for name, kind, mib in re.findall(r"(\S+)\s+(model|KV|compute|output) buffer size =\s*([\d.]+) MiB", "".join(lines)):
        key = f"{name} {kind}"
        sizes[key] = sizes.get(key, 0.0) + float(mib)
    return sizes


def test_memory_estimate_within_15_percent_of_llama_cpp(tiny_main, tiny_draft):
    main_info, draft_info = read_gguf(tiny_main), read_gguf(tiny_draft)
    est = estimate_memory(main_info, draft_info, 4096)
    sizes = _llama_cpp_buffers([tiny_main, tiny_draft], 4096)
    # CPU_REPACK and AMX (x86/ARM CPU builds) hold re-laid-out copies of tensors whose file pages stay mapped, so
    # they are not counted twice; without AMX the whole file is mapped (checked here)
    mapped = sizes.get("CPU_Mapped model", 0.0) + sizes.get("CPU model", 0.0)
    if "AMX model" not in sizes:
        assert mapped == pytest.approx((main_info.tensor_bytes + draft_info.tensor_bytes) / MiB, rel=0.01)
    measured = sum(v for k, v in sizes.items() if not k.startswith(("CPU_REPACK", "AMX")))
    kv = sum(v for k, v in sizes.items() if k.endswith(" KV"))
    assert kv == pytest.approx(sum(m.kv_cache for m in est.models) / MiB, rel=0.01)
    assert est.total / MiB == pytest.approx(measured, rel=0.15), (sizes, est)


@pytest.mark.parametrize("case", ["missing", "text", "truncated_header", "truncated_data", "garbage", "unknown_id"])
def test_bad_input_is_one_line_error(capsys, tmp_path, smollm2, case):
    target = tmp_path / "x.gguf"
    if case == "missing":
        arg = str(tmp_path / "nope.gguf")
    elif case == "unknown_id":
        arg = "no-such-model"
    else:
        if case == "text":
            target.write_text("this is not a model\n")
        elif case == "garbage":
            target.write_bytes(b"GGUF\x03\x00\x00\x00" + bytes(range(256)) * 64)
        else:
            with open(smollm2, "rb") as src:  # its header is ~1.8 MB: cut inside it, or inside the tensor data
                target.write_bytes(src.read(MiB if case == "truncated_header" else 8 * MiB))
        arg = str(target)
    rc, out, err = _cli(capsys, "inspect", arg)
    assert rc != 0 and out == ""
    assert err.count("\n") == 1 and err.startswith("speclocal: error: ") and "Traceback" not in err
    assert (arg if case != "missing" else "nope.gguf") in err


def test_models_listing(capsys, tiny_main, tiny_draft, tmp_path):
    rc, out, _ = _cli(capsys, "models")
    assert rc == 0
    assert re.search(r"^\* tiny\s+qwen2.5-coder-1.5b-q4km\s+qwen2.5-coder-0.5b-q4km\s+2.4 GB @ 4096", out, re.M)
    assert re.search(r"^qwen2.5-coder-1.5b-q4km\s+Q4_K_M\s+1.5B\s+1.04 GiB\s+(verified|present)\s+yes", out, re.M)
    rc, out, _ = _cli(capsys, "models", "--json")
    data = json.loads(out)
    assert data["dir"] == str(models_dir()) and data["default_pair"] == "tiny"
    status = {m["id"]: m["status"] for m in data["models"]}
    assert status["qwen2.5-coder-1.5b-q4km"] != "missing" and status["qwen2.5-coder-0.5b-q4km"] != "missing"
    assert {p["id"] for p in data["pairs"]} >= {"tiny", "coder-7b", "coder-32b"}
    rc, out, _ = _cli(capsys, "models", "--json", "--dir", str(tmp_path))
    assert {m["status"] for m in json.loads(out)["models"]} == {"missing"}


def test_compat_rules_in_llama_cpp_order(tiny_main, tiny_draft):
    import dataclasses

    a, b = read_gguf(tiny_main), read_gguf(tiny_draft)
    assert check_compat(a, dataclasses.replace(b, vocab_type="SPM")).rule == "vocab_type"
    assert check_compat(a, dataclasses.replace(b, add_bos=True)).rule == "bos"
    assert check_compat(a, dataclasses.replace(b, eos_id=0)).ok  # EOS id only matters when EOS is added
    assert check_compat(a, dataclasses.replace(b, add_eos=True)).rule == "eos"
    tokens = list(b.tokens)
    tokens[100] = b"other"
    c = check_compat(a, dataclasses.replace(b, tokens=tuple(tokens)))
    assert c.rule == "token_text" and "token 100" in c.detail
    assert check_compat(a, dataclasses.replace(b, tokens=(b"x",) * 5 + b.tokens[5:])).ok  # ids below 5 are not compared


def test_catalogue_ram_figure_for_the_default_pair_matches_the_estimate(tiny_main, tiny_draft):
    from speclocal.models.catalogue import load_catalogue
    from speclocal.models.gguf_info import estimate_memory, read_gguf

    pair = load_catalogue().pair("tiny")
    est = estimate_memory(read_gguf(tiny_main), read_gguf(tiny_draft), pair.ram_ctx)
    assert est.total / 1e9 == pytest.approx(pair.ram_gb, rel=0.05)
