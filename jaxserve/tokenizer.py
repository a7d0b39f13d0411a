"""The tokenizer beside a model: a thin wrapper over a Hugging Face ``tokenizer.json``."""
from __future__ import annotations

import pathlib

import tokenizers

TOKENIZER_FILE = "tokenizer.json"
_EOS_CANDIDATES = ("<|endoftext|>", "</s>", "<|im_end|>", "<eos>")


class Tokenizer:
    """``encode(str) -> list[int]``, ``decode(list[int]) -> str``, ``eos_token_id``."""

    def __init__(self, hf: tokenizers.Tokenizer, eos_token: str | None = None):
        self._hf = hf
        vocab = hf.get_vocab()
        names = [eos_token] if eos_token else [t for t in _EOS_CANDIDATES if t in vocab]
        self.eos_token = names[0] if names and names[0] in vocab else None
        self.eos_token_id = vocab[self.eos_token] if self.eos_token else None

    @property
    def vocab_size(self) -> int:
        return self._hf.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        return self._hf.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self._hf.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._hf.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def save(self, path: str | pathlib.Path) -> pathlib.Path:
        """Writes ``tokenizer.json`` into directory ``path`` (or to ``path`` if it names a .json file)."""
        path = pathlib.Path(path)
        target = path if path.suffix == ".json" else path / TOKENIZER_FILE
        self._hf.save(str(target))
        return target


def load_tokenizer(path: str | pathlib.Path) -> Tokenizer:
    """Loads ``tokenizer.json`` from a model directory (or the file itself)."""
    path = pathlib.Path(path)
    target = path / TOKENIZER_FILE if path.is_dir() else path
    if not target.is_file():
        raise FileNotFoundError(f"no tokenizer at {target}")
    return Tokenizer(tokenizers.Tokenizer.from_file(str(target)))
