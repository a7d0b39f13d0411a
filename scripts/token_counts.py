"""Writes token_counts.json beside a model's weights: how often each token id occurs in a corpus split.

    python scripts/token_counts.py jaxserve/zoo/tiny-code-draft [--split train] [--corpus PATH]

What ``SpeculativeConfig(draft_vocab_size=N)`` reads to restrict a draft to its N most frequent tokens
(``jaxserve.speculative.draft_vocab``). The model directory's own tokenizer encodes the split (default: the
committed pycode-v1 snapshot's training split).
"""
from __future__ import annotations

import argparse

import numpy as np

from jaxserve.speculative.token_counts import write_counts
from jaxserve.tokenizer import load_tokenizer
from jaxserve.train.corpus import CORPUS_NAME
from jaxserve.train.data import encode_split


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model_dir")
    ap.add_argument("--split", default="train")
    ap.add_argument("--corpus", default=None, help=".jsonl.xz snapshot (default: the committed pycode-v1)")
    args = ap.parse_args()
    tokenizer = load_tokenizer(args.model_dir)
    stream = encode_split(tokenizer, args.corpus, args.split)
    counts = np.bincount(stream, minlength=tokenizer.vocab_size)
    corpus = f"{args.corpus or CORPUS_NAME} {args.split} split, {len(stream)} tokens (EOS between documents)"
    print(write_counts(args.model_dir, counts, corpus), corpus)


if __name__ == "__main__":
    main()
