"""``benchmarks/peers/compare.py``'s backend variants (``NAME@VARIANT``): parsed into options, or refused by name;
and the order of its timed runs."""
import argparse
import importlib.util
import pathlib

import pytest

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "peers" / "compare.py"
spec = importlib.util.spec_from_file_location("peer_compare", SCRIPT)
compare = importlib.util.module_from_spec(spec)
spec.loader.exec_module(compare)


def args(**kw):
    base = dict(dtype="bfloat16", max_num_seqs=64, max_model_len=1024, threads=2, gguf_file=None, kv_cache_gib=1)
    return argparse.Namespace(**(base | kw))


def test_plain_names_keep_the_shared_options():
    name, opts = compare.backend_options("llama.cpp", args(gguf_file="m.gguf"))
    assert (name, opts.dtype, opts.gguf_type, opts.gguf_file) == ("llama.cpp", "bfloat16", None, "m.gguf")
    name, opts = compare.backend_options("hf", args(gguf_file="m.gguf"))
    assert (name, opts.gguf_file, opts.overrides) == ("hf", None, ())
    name, opts = compare.backend_options("jaxserve@engine.quantization=nvfp4", args(kv_cache_gib=3))
    assert (name, opts.kv_cache_gib, opts.overrides) == ("jaxserve", 3, ("engine.quantization=nvfp4",))


def test_variants_set_the_gguf_type_or_engine_overrides():
    name, opts = compare.backend_options("llama.cpp@Q4_0", args(gguf_file="m.gguf"))
    assert (name, opts.gguf_type, opts.gguf_file) == ("llama.cpp", "Q4_0", None)
    name, opts = compare.backend_options("llama.cpp@file", args(gguf_file="m.gguf"))
    assert (name, opts.gguf_type, opts.gguf_file) == ("llama.cpp", None, "m.gguf")
    name, opts = compare.backend_options("jaxserve@engine.quantization=nvfp4+engine.block_size=32", args())
    assert (name, opts.overrides) == ("jaxserve", ("engine.quantization=nvfp4", "engine.block_size=32"))


@pytest.mark.parametrize("spec, message", [
    ("llama.cpp@Q5_X", "backend 'llama.cpp@Q5_X': 'Q5_X' is not a GGML type"),
    ("llama.cpp@file", "backend 'llama.cpp@file' serves --gguf-file, which was not given"),
    ("hf@F16", "backend 'hf@F16': only llama.cpp and jaxserve take a variant"),
    ("jaxserve@engine.no_such_field=1", "no_such_field"),
])
def test_bad_variants_are_refused_naming_them(spec, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(".", r"\.")):
        compare.backend_options(spec, args())


def test_rounds_rotate_the_backends_and_back_to_back_keeps_each_backends_runs_together():
    names, loads = ["jaxserve", "jaxserve@engine.num_scheduler_steps=8", "vllm"], ["batch64", "sharegpt"]
    rotating = compare.schedule(names, loads, 4, back_to_back=False)
    together = compare.schedule(names, loads, 4, back_to_back=True)
    for runs in (rotating, together):  # every (workload, backend) runs once a round, each round once
        assert sorted(runs) == sorted((r, w, n) for r in range(4) for w in loads for n in names)
    # round r starts at the r-th backend: each backend leads a workload's round in turn
    assert [[n for r, w, n in rotating if r == k and w == "batch64"][0] for k in range(4)] == [*names, names[0]]
    # back to back: a backend's 4 runs of a workload are consecutive, in round order
    assert together[:4] == [(r, "batch64", "jaxserve") for r in range(4)]
    assert [n for _, w, n in together if w == "batch64"] == [n for n in names for _ in range(4)]
