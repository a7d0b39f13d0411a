"""Fixtures for the training tests: a small synthetic corpus, its tokenizer, a tiny run config."""
from __future__ import annotations

import dataclasses
import random

import pytest

from jaxserve.config import ModelConfig
from jaxserve.tokenizer import Tokenizer
from jaxserve.train import DataConfig, TrainConfig, TrainRunConfig
from jaxserve.train.corpus import select_files, write_corpus
from jaxserve.train.tokenizer import train_tokenizer


def _fake_module(rng: random.Random, i: int) -> str:
    names = ["alpha", "beta", "gamma", "delta", "value", "items", "result", "count"]
    lines = [f'"""Module {i}."""', "import os", ""]
    for j in range(rng.randint(2, 4)):
        a, b = rng.sample(names, 2)
        lines += [f"def {a}_{i}_{j}({a}, {b}=None):", f"    if {b} is None:", f"        return {a} + {j}",
                  f"    return [{a} * {b} for _ in range({rng.randint(1, 9)})]", ""]
    return "\n".join(lines)


@pytest.fixture(scope="session")
def tiny_lib(tmp_path_factory):
    """A fake ``Lib/`` with enough modules that both splits get files, plus a test dir to exclude."""
    lib, rng = tmp_path_factory.mktemp("Lib"), random.Random(0)
    for i in range(60):
        sub = lib / ("pkg" if i % 3 else "") / f"mod{i}.py"
        sub.parent.mkdir(exist_ok=True)
        sub.write_text(_fake_module(rng, i))
    (lib / "test").mkdir()
    (lib / "test" / "test_x.py").write_text("assert True\n")
    return lib


@pytest.fixture(scope="session")
def tiny_corpus(tiny_lib, tmp_path_factory):
    out = tmp_path_factory.mktemp("corpus") / "tiny.jsonl.xz"
    write_corpus(tiny_lib, select_files(tiny_lib, 10**9), out)
    return out


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_corpus, tmp_path_factory):
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    Tokenizer(train_tokenizer(tiny_corpus, vocab_size=320)).save(path)
    return path


@pytest.fixture(scope="session")
def tiny_run(tiny_corpus, tiny_tokenizer, tmp_path_factory):
    """A run config that trains a 2-layer, 32-wide model on a few hundred tokens in a second or two."""
    from jaxserve.tokenizer import load_tokenizer
    vocab = load_tokenizer(tiny_tokenizer).vocab_size
    model = ModelConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                        num_kv_heads=2, head_dim=8, max_position_embeddings=64)
    train = TrainConfig(steps=6, batch_size=4, grad_accum=2, lr=1e-2, warmup_steps=1, eval_every=3,
                        eval_windows=4, checkpoint_every=3, log_every=1, out_dir=str(tmp_path_factory.mktemp("run")))
    data = DataConfig(corpus=str(tiny_corpus), tokenizer=str(tiny_tokenizer), seq_len=16, max_train_tokens=400)
    return TrainRunConfig(model=model, train=train, data=data)


def with_train(rc: TrainRunConfig, **kw) -> TrainRunConfig:
    return dataclasses.replace(rc, train=dataclasses.replace(rc.train, **kw))
