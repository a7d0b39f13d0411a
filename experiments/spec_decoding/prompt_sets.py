"""Chat prompt sets for speculative decoding on an instruction-tuned target (its chat template applied).

``"chat_repetitive"``: tasks whose answer quotes its input: code edits (add comments, rename, add type hints,
fix the style, return the whole code) over 12-line snippets of the pycode-v1 *val* split, and text tasks
(correct and return in full, quote then summarize) over paragraphs of ``tests/data/real_text``: where copying
proposers (n-gram, suffix) have something to copy. ``"chat_free"``: open questions whose answers are new text.
Both are held out from ``scripts/onpolicy_chat.py``'s training prompts (the zoo SmolLM2 draft's data) except the
license paragraphs, which that script also used, with other instructions.
"""
from __future__ import annotations

import pathlib
import textwrap

import numpy as np

REAL_TEXT = pathlib.Path(__file__).resolve().parents[2] / "tests" / "data" / "real_text"
CHAT_SETS = ("chat_repetitive", "chat_free")
CODE_EDITS = ("Add a short comment to each line of this Python code and return the whole code:",
              "Rename the variables of this Python code to clearer names and return the whole code:",
              "Add type hints to this Python code and return the whole code:",
              "Reformat this Python code to follow PEP 8 and return the whole code:")
TEXT_EDITS = ("Correct any spelling mistakes in this text and return the whole text:",
              "Quote the first sentence of this text exactly, then summarize the rest:",
              "Repeat this text word for word, then give it a title:")
OPEN_QUESTIONS = (
    "What would happen if the Moon disappeared?", "Why do cats purr?", "How do airplanes stay in the air?",
    "What makes a good teacher?", "Describe a day in the life of a medieval farmer.",
    "What are the pros and cons of remote work?", "How do bees make honey?", "Why do we dream?",
    "Write a short story about a lighthouse keeper.", "What is the history of the bicycle?",
    "How does a refrigerator keep food cold?", "What should a beginner know about investing?",
    "Explain how a compiler works.", "Why are some languages harder to learn than others?",
    "Invent a new board game and explain its rules.", "How do volcanoes form?",
)


def _paragraphs(min_chars: int = 300) -> list[str]:
    paras = []
    for path in sorted(REAL_TEXT.glob("*.txt")):
        paras += [p for b in path.read_text().split("\n\n") if len(p := " ".join(b.split())) >= min_chars]
    return paras


def _code_snippets(rng: np.random.Generator, count: int, lines: int = 12) -> list[str]:
    from jaxserve.train.corpus import iter_documents

    docs = [d for d in iter_documents(None, "val") if d.count("\n") > 3 * lines]
    out = []
    for i in rng.choice(len(docs), count, replace=False):
        rows = [r for r in docs[i].splitlines() if r.strip()]
        start = int(rng.integers(0, len(rows) - lines))
        out.append(textwrap.dedent("\n".join(rows[start:start + lines])))
    return out


def _clip(tokenizer, text: str, max_tokens: int) -> str:
    return tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)[:max_tokens])


def chat_prompts(tokenizer, name: str, count: int, max_len: int, seed: int) -> list[list[int]]:
    """``count`` chat-templated prompts (token ids, each at most ``max_len`` long) of set ``name``."""
    if name not in CHAT_SETS:
        raise ValueError(f"unknown chat prompt set {name!r}; known: {CHAT_SETS}")
    rng = np.random.default_rng(seed)

    def chat(text: str) -> list[int]:
        return tokenizer.encode_chat([{"role": "user", "content": text}])

    overhead = len(chat(""))
    if name == "chat_free":
        order = [OPEN_QUESTIONS[i] for i in rng.permutation(len(OPEN_QUESTIONS))]
        return [chat(q) for q in (order * -(-count // len(order)))[:count]]
    if max_len - overhead < 48:
        raise ValueError(f"max_len={max_len} leaves no room for a snippet after the chat template's {overhead} tokens")
    code = _code_snippets(rng, -(-count // 2))
    paras = _paragraphs()
    paras = [paras[i] for i in rng.choice(len(paras), count // 2, replace=False)]
    prompts = []
    for i in range(count):
        if i % 2 == 0:
            edit, wrap = CODE_EDITS[i // 2 % len(CODE_EDITS)], "```python\n{}\n```"
            source = code[i // 2]
        else:
            edit, wrap, source = TEXT_EDITS[i // 2 % len(TEXT_EDITS)], "{}", paras[i // 2]
        body = max_len - overhead
        while len(ids := chat(f"{edit}\n\n" + wrap.format(_clip(tokenizer, source, body)))) > max_len:
            body -= 4  # the instruction and the fences: a few tokens at a time until the whole prompt fits
        prompts.append(ids)
    return prompts
