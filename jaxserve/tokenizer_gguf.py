"""A ``tokenizers`` tokenizer from a GGUF file's metadata (``tokenizer.ggml.*``): no hand-written BPE.

A GGUF carries no ``tokenizer.json``: it stores the vocabulary, the merges, the token types and the name
of llama.cpp's pre-tokenizer (``tokenizer.ggml.pre``). This module turns those into a byte-level BPE
``tokenizers.Tokenizer`` whose pre-tokenizer is the split llama.cpp applies for that name
(``llama-vocab.cpp``), control tokens added as special tokens, user-defined ones as added tokens.

Byte-level BPE vocabularies (``tokenizer.ggml.model == "gpt2"``: Llama 3, Qwen, SmolLM, Mistral's Tekken ...)
and Gemma's sentencepiece vocabulary (``"llama"`` in a ``gemma``/``gemma2``/``gemma3`` file) are built, the
latter as transformers' GGUF integration builds it (``GemmaTokenizer``): BPE with byte fallback, spaces
normalized to ``▁``, and merges recovered from the vocabulary (the file lists none), ranked by the order the
tokens appear in the file. Any other sentencepiece vocabulary (Llama 2, Mistral v1 ...) is a clear error.
"""
from __future__ import annotations

import tokenizers
from tokenizers import decoders, models, normalizers, pre_tokenizers, Regex

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
# sentencepiece vocabularies built, by architecture: Gemma's (the only ones whose layout is known here)
SENTENCEPIECE_ARCHITECTURES = ("gemma", "gemma2", "gemma3")


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


def _byte_level_bpe(meta: dict, tokens: list[str]) -> tokenizers.Tokenizer:
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges") or []]
    hf = tokenizers.Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges, fuse_unk=False,
                                         byte_fallback=False))
    hf.pre_tokenizer = _pre_tokenizer(meta.get("tokenizer.ggml.pre", "default"))
    hf.decoder = decoders.ByteLevel()
    return hf


def gemma_merges(tokens: list[str]) -> list[tuple[str, str]]:
    """The BPE merges a Gemma vocabulary implies (transformers' ``generate_merges`` with the file's order as
    the score): every split of a token into two vocabulary tokens, best-ranked token first, then the longer
    left piece first."""
    vocab = {t: i for i, t in enumerate(tokens)}  # a repeated token keeps its last id, as in a dict literal
    merges = []
    for token in vocab:  # in first-appearance order: the stable sort below keeps it among equal keys
        local = [(token[:i], token[i:]) for i in range(1, len(token)) if token[:i] in vocab and token[i:] in vocab]
        local.sort(key=lambda pair: (vocab[pair[0]], vocab[pair[1]]))
        merges.extend((-vocab[token], left, right) for left, right in local)
    merges.sort(key=lambda m: (m[0], len(m[1]), len(m[2])), reverse=True)
    return [(left, right) for _, left, right in merges]


def _gemma_bpe(tokens: list[str]) -> tokenizers.Tokenizer:
    """``tokens`` with runs of spaces respelled as ``▁`` runs (the file stores ``"  "``, the model looks up
    ``"▁▁"``), as a byte-fallback BPE over ``▁``-normalized text."""
    hf = tokenizers.Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, gemma_merges(tokens), fuse_unk=True,
                                         unk_token="<unk>", byte_fallback=True))
    hf.normalizer = normalizers.Replace(" ", "\u2581")
    hf.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")
    hf.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    return hf


def tokenizer_from_gguf(meta: dict) -> Tokenizer:
    """The tokenizer described by GGUF metadata ``meta`` (``jaxserve.models.gguf.metadata``), with its
    chat template (``tokenizer.chat_template``) and end-of-sequence token (``tokenizer.ggml.eos_token_id``)."""
    kind, arch = meta.get("tokenizer.ggml.model"), meta.get("general.architecture")
    tokens = list(meta["tokenizer.ggml.tokens"])
    types = list(meta.get("tokenizer.ggml.token_type") or [1] * len(tokens))
    if kind == "gpt2":
        hf = _byte_level_bpe(meta, tokens)
    elif kind == "llama" and arch in SENTENCEPIECE_ARCHITECTURES:
        tokens = ["\u2581" * len(t) if " " in t and not t.strip() else t for t in tokens]
        hf = _gemma_bpe(tokens)
    else:
        raise ValueError(f"GGUF tokenizer.ggml.model={kind!r} (general.architecture={arch!r}) is not supported: "
                         "byte-level BPE ('gpt2') is, and sentencepiece ('llama') for the architectures "
                         f"{list(SENTENCEPIECE_ARCHITECTURES)}")
    vocab = hf.get_vocab()
    hf.add_special_tokens([tokenizers.AddedToken(t, special=True, normalized=False)
                           for t, ty in zip(tokens, types) if ty == _CONTROL])
    hf.add_tokens([tokenizers.AddedToken(t, special=False, normalized=False)
                   for t, ty in zip(tokens, types) if ty == _USER_DEFINED and t in vocab])
    eos = meta.get("tokenizer.ggml.eos_token_id")
    bos = meta.get("tokenizer.ggml.bos_token_id")
    return Tokenizer(hf, eos_token=tokens[eos] if eos is not None else None,
                     chat_template=meta.get("tokenizer.chat_template"),
                     bos_token=tokens[bos] if bos is not None else None,
                     add_bos_token=bool(meta.get("tokenizer.ggml.add_bos_token", False)))
