"""Trains the byte-level BPE tokenizer of the zoo models on the corpus's training split.

Id 0 is ``<|endoftext|>``: the end-of-sequence token and the separator between documents.
"""
from __future__ import annotations

import pathlib

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from jaxserve.train.corpus import iter_documents

EOS_TOKEN = "<|endoftext|>"


def train_tokenizer(corpus_path: str | pathlib.Path | None = None, vocab_size: int = 4096) -> Tokenizer:
    """Byte-level BPE over the training split; every byte is in the alphabet, so nothing is unknown."""
    if vocab_size < 256 + 1:
        raise ValueError(f"vocab_size must hold the 256 bytes and {EOS_TOKEN}, got {vocab_size}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS_TOKEN], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(iter_documents(corpus_path, "train"), trainer)
    return tok
