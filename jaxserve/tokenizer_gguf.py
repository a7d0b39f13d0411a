"""A ``tokenizers`` tokenizer from a GGUF file's metadata (``tokenizer.ggml.*``): no hand-written BPE.

A GGUF carries no ``tokenizer.json``: it stores the vocabulary, the merges, the token types and the name
of llama.cpp's pre-tokenizer (``tokenizer.ggml.pre``). This module turns those into a byte-level BPE
``tokenizers.Tokenizer`` whose pre-tokenizer is the split llama.cpp applies for that name
(``llama-vocab.cpp``), control tokens added as special tokens, user-defined ones as added tokens.

Only byte-level BPE vocabularies (``tokenizer.ggml.model == "gpt2"``: Llama 3, Qwen, SmolLM, Mistral's
Tekken ...) are built; a sentencepiece vocabulary (``"llama"``) is a clear error.
"""
from __future__ import annotations

import tokenizers
from tokenizers import decoders, models, pre_tokenizers, Regex

from jaxserve.tokenizer import Tokenizer

_CONTROL, _USER_DEFINED = 3, 4  # llama.cpp's token types
_GPT2 = "gpt2"  # tokenizers' ByteLevel(use_regex=True) is GPT-2's split
_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# tokenizer.ggml.pre -> the split llama.cpp applies before BPE. "digits": each digit on its own, then GPT-2's.
PRE_TOKENIZERS = {
    "default": _GPT2, "gpt2": _GPT2, "mpt": _GPT2, "olmo": _GPT2,
    "smollm": "digits", "starcoder": "digits", "refact": "digits", "codeshell": "digits", "command-r": "digits",
    "llama3": _LLAMA3, "llama-bpe": _LLAMA3, "llama-v3": _LLAMA3, "smaug-bpe": _LLAMA3, "dbrx": _LLAMA3,
    "qwen2": _QWEN2, "deepseek-r1-qwen": _QWEN2,
}


def _pre_tokenizer(name: str):
    if name not in PRE_TOKENIZERS:
        raise ValueError(f"GGUF tokenizer.ggml.pre={name!r} is not supported; supported: {sorted(PRE_TOKENIZERS)}")
    split = PRE_TOKENIZERS[name]
    if split == _GPT2:
        return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if split == "digits":
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(split), behavior="isolated"),
                                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


def tokenizer_from_gguf(meta: dict) -> Tokenizer:
    """The tokenizer described by GGUF metadata ``meta`` (``jaxserve.models.gguf.metadata``), with its
    chat template (``tokenizer.chat_template``) and end-of-sequence token (``tokenizer.ggml.eos_token_id``)."""
    kind = meta.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise ValueError(f"GGUF tokenizer.ggml.model={kind!r} is not supported (only byte-level BPE, 'gpt2')")
    tokens = list(meta["tokenizer.ggml.tokens"])
    types = list(meta.get("tokenizer.ggml.token_type") or [1] * len(tokens))
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges") or []]
    vocab = {t: i for i, t in enumerate(tokens)}
    hf = tokenizers.Tokenizer(models.BPE(vocab, merges, fuse_unk=False, byte_fallback=False))
    hf.pre_tokenizer = _pre_tokenizer(meta.get("tokenizer.ggml.pre", "default"))
    hf.decoder = decoders.ByteLevel()
    hf.add_special_tokens([tokenizers.AddedToken(t, special=True, normalized=False)
                           for t, ty in zip(tokens, types) if ty == _CONTROL])
    hf.add_tokens([tokenizers.AddedToken(t, special=False, normalized=False)
                   for t, ty in zip(tokens, types) if ty == _USER_DEFINED])
    eos = meta.get("tokenizer.ggml.eos_token_id")
    bos = meta.get("tokenizer.ggml.bos_token_id")
    return Tokenizer(hf, eos_token=tokens[eos] if eos is not None else None,
                     chat_template=meta.get("tokenizer.chat_template"),
                     bos_token=tokens[bos] if bos is not None else None,
                     add_bos_token=bool(meta.get("tokenizer.ggml.add_bos_token", False)))
