"""The tokenizer beside a model: a thin wrapper over a ``tokenizers.Tokenizer``, with its chat template.

Built from a Hugging Face ``tokenizer.json`` (``load_tokenizer``; the chat template and EOS token from
``tokenizer_config.json`` or ``chat_template.jinja`` beside it) or from a GGUF file's metadata
(``jaxserve.tokenizer_gguf``).
"""
from __future__ import annotations

import json
import pathlib

import tokenizers

TOKENIZER_FILE = "tokenizer.json"
_EOS_CANDIDATES = ("<|endoftext|>", "</s>", "<|im_end|>", "<eos>")
# tokens that close a chat turn in the templates of common model families (ChatML, Llama 3, Gemma, Phi)
_END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|end|>", "<|endoftext|>", "</s>", "<eos>")


class Tokenizer:
    """``encode(str) -> list[int]``, ``decode(list[int]) -> str``, ``eos_token_id``, and
    ``apply_chat_template(conversation) -> str`` when the model has a chat template."""

    def __init__(self, hf: tokenizers.Tokenizer, eos_token: str | None = None, chat_template: str | None = None,
                 bos_token: str | None = None, add_bos_token: bool = False):
        self._hf = hf
        vocab = hf.get_vocab()
        names = [eos_token] if eos_token else [t for t in _EOS_CANDIDATES if t in vocab]
        self.eos_token = names[0] if names and names[0] in vocab else None
        self.eos_token_id = vocab[self.eos_token] if self.eos_token else None
        self.bos_token = bos_token if bos_token in vocab else None
        self.bos_token_id = vocab[self.bos_token] if self.bos_token else None
        self.add_bos_token = add_bos_token and self.bos_token_id is not None
        self.chat_template = chat_template
        # the ids that end an assistant turn: EOS and the template's own end-of-turn markers
        marks = [t for t in _END_OF_TURN if t in vocab and (chat_template is None or t in chat_template)]
        self.end_of_turn_ids = tuple(dict.fromkeys(
            ([self.eos_token_id] if self.eos_token_id is not None else []) + [vocab[t] for t in marks]))

    @property
    def vocab_size(self) -> int:
        return self._hf.get_vocab_size()

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``; special tokens written in it (``<|im_start|>``) are matched whole. A BOS is
        prepended only where the model asks for one (``add_bos_token``) and ``add_special_tokens``."""
        ids = self._hf.encode(text, add_special_tokens=False).ids
        return [self.bos_token_id] + ids if add_special_tokens and self.add_bos_token else ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def apply_chat_template(self, conversation, add_generation_prompt: bool = True) -> str:
        """The prompt text of ``conversation`` (a list of ``{"role", "content"}``) under the model's template."""
        from jaxserve.chat_template import render_chat
        if self.chat_template is None:
            raise ValueError("this model has no chat template (none in its GGUF metadata or tokenizer_config.json)")
        return render_chat(self.chat_template, conversation, add_generation_prompt,
                           bos_token=self.bos_token or "", eos_token=self.eos_token or "")

    def encode_chat(self, conversation, add_generation_prompt: bool = True) -> list[int]:
        """Token ids of the templated ``conversation``: the template writes any BOS itself (as transformers)."""
        return self.encode(self.apply_chat_template(conversation, add_generation_prompt), add_special_tokens=False)

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
    return Tokenizer(tokenizers.Tokenizer.from_file(str(target)), **_tokenizer_config(target.parent))


def _tokenizer_config(directory: pathlib.Path) -> dict:
    """Chat template and special tokens from an HF directory's tokenizer_config.json / chat_template.jinja."""
    found = {}
    config_file = directory / "tokenizer_config.json"
    if config_file.is_file():
        try:
            config = json.loads(config_file.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{config_file} is not valid JSON: {e}") from None
        if not isinstance(config, dict):
            raise ValueError(f"{config_file} must hold a JSON object, got {type(config).__name__}")
        for key in ("eos_token", "bos_token"):
            token = config.get(key)
            token = token.get("content") if isinstance(token, dict) else token
            if isinstance(token, str):
                found[key] = token
        if isinstance(config.get("chat_template"), str):
            found["chat_template"] = config["chat_template"]
        found["add_bos_token"] = bool(config.get("add_bos_token", False))
    if (directory / "chat_template.jinja").is_file():
        found["chat_template"] = (directory / "chat_template.jinja").read_text()
    return found
