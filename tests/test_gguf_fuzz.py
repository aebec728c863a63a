"""Fuzz the GGUF header reader with mutated headers derived from the real files (a quick slice of
scripts/fuzz_gguf.py, which runs 100,000+ and records its result in docs/)."""

import resource

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from speclocal.models.gguf_info import read_gguf


@pytest.fixture(scope="module")
def fuzz(load_script):
    """scripts/fuzz_gguf.py: the seeds, the mutations and the check of one case."""
    return load_script("fuzz_gguf")


@pytest.fixture(scope="module")
def seeds(fuzz, tiny_draft, smollm2):
    return [(fuzz.mini_seed(p), p.stat().st_size) for p in (tiny_draft, smollm2)]


def mutations(fuzz) -> st.SearchStrategy:
    """One to six of the fuzzer's mutations, each with where it applies, an extreme value and a byte."""
    return st.lists(
        st.tuples(st.sampled_from(fuzz.OPS), st.integers(0, 2**31), st.sampled_from(fuzz.EXTREMES),
                  st.integers(0, 255)),
        min_size=1, max_size=6,
    )


def test_mini_seeds_are_valid_ggufs(fuzz, seeds, tmp_path, tiny_draft, smollm2):
    for (seed, size), real in zip(seeds, (tiny_draft, smollm2)):
        path = tmp_path / "seed.gguf"
        assert fuzz.check_one(path, seed, size) == "ok"
        info, ref = read_gguf(path), read_gguf(real)
        assert (info.architecture, info.n_layer, info.tensor_bytes) == (ref.architecture, ref.n_layer, ref.tensor_bytes)
        assert info.vocab_size == 32  # arrays were cut to 32 elements


@settings(max_examples=1500, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_mutated_headers_give_only_clean_errors(fuzz, seeds, tmp_path, data):
    ops = data.draw(mutations(fuzz))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for i, (seed, size) in enumerate(seeds):
        fuzz.check_one(tmp_path / f"m{i}.gguf", fuzz.mutate(seed, ops), size)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 64 * 1024  # KiB: no unbounded allocation
