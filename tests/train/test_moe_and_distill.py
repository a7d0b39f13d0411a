"""The trainer's MoE path (loss-free balancing state, its checkpoints and export), distillation and init_from."""
import dataclasses
import json

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxserve.models.checkpoint import load_model, save_model
from jaxserve.models import init_params
from jaxserve.moe.balancing import init_router_state
from jaxserve.moe.router_state_file import load_router_state
from jaxserve.train.moe import make_moe_train_step
from jaxserve.tokenizer import load_tokenizer
from jaxserve.train import train
from jaxserve.train.data import BatchOrder, encode_split, windows
from jaxserve.train.step import distill_loss, make_optimizer
from tests.train.conftest import with_train

RATE = 0.01


@pytest.fixture(scope="module")
def moe_run(tiny_run, tmp_path_factory):
    model = dataclasses.replace(tiny_run.model, num_layers=1, num_experts=4, num_experts_per_tok=2,
                                moe_intermediate_size=16, num_shared_experts=1, router="deepseek_v3")
    train_cfg = dataclasses.replace(tiny_run.train, steps=4, eval_every=100, bias_rate=RATE,
                                    out_dir=str(tmp_path_factory.mktemp("moe")))
    return dataclasses.replace(tiny_run, model=model, train=train_cfg)


@pytest.fixture(scope="module")
def moe_full(moe_run):
    return train(moe_run, progress=False)


@pytest.fixture(scope="module")
def teacher(tiny_run, tmp_path_factory):
    """A random-weight checkpoint of tiny_run's model: the teacher / init_from source (no training needed)."""
    path = tmp_path_factory.mktemp("teacher") / "final"
    save_model(path, tiny_run.model, jax.device_get(init_params(tiny_run.model, jax.random.key(7))))
    return path


def _rows(result) -> list[dict]:
    return [json.loads(line) for line in (result["out_dir"] / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow  # compiles two MoE training steps: ~1 min of CPU idle, ~10 min on the loaded 2-core machine
def test_moe_steps_match_the_moe_training_reference_and_export_the_biases(moe_run, moe_full):
    rc = with_train(moe_run, grad_accum=1)
    first_two = train(with_train(rc, out_dir=moe_run.train.out_dir + "-ref"), stop_after=2, progress=False)
    tok = load_tokenizer(rc.data.tokenizer)
    train_w = windows(encode_split(tok, rc.data.corpus, "train", rc.data.max_train_tokens), rc.data.seq_len)
    order = BatchOrder(len(train_w), rc.train.batch_size, rc.train.seed)
    params = init_params(rc.model, jax.random.key(rc.train.seed))
    router_state, opt = init_router_state(rc.model), make_optimizer(rc.train)[0]
    step, opt_state = make_moe_train_step(rc.model, opt, "loss_free", rate=RATE), opt.init(params)
    for s in range(2):
        params, router_state, opt_state, _ = step(params, router_state, opt_state, jnp.asarray(train_w[order.indices(s)]))
    chex.assert_trees_all_close(jax.device_get(first_two["params"]), jax.device_get(params), atol=1e-6)
    chex.assert_trees_all_equal(jax.device_get(first_two["router_state"]), jax.device_get(router_state))
    saved = load_router_state(moe_full["out_dir"] / "final")
    chex.assert_trees_all_equal(saved, jax.device_get(moe_full["router_state"]))
    rows = _rows(moe_full)
    assert all(r["max_vio"] >= 0 for r in rows if "loss" in r)
    assert 0 <= rows[-1]["max_vio_global"] <= 3  # MaxVio is at most E - 1 = 3


@pytest.mark.slow  # another MoE compile plus two runs: ~10 min on the loaded 2-core machine
def test_moe_resume_is_bit_identical_including_router_state(moe_run, moe_full, tmp_path):
    interrupted = with_train(moe_run, out_dir=str(tmp_path / "resumed"))
    assert train(interrupted, stop_after=2, progress=False)["step"] == 2
    resumed = train(interrupted, progress=False)
    chex.assert_trees_all_equal(jax.device_get(moe_full["params"]), jax.device_get(resumed["params"]))
    chex.assert_trees_all_equal(jax.device_get(moe_full["router_state"]), jax.device_get(resumed["router_state"]))


def test_distill_loss_against_numpy():
    rng = np.random.default_rng(0)
    logits, teacher_logits = rng.normal(size=(2, 3, 5)), rng.normal(size=(2, 3, 5))
    targets = rng.integers(0, 5, (2, 3))
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    tlogp = teacher_logits - np.log(np.exp(teacher_logits).sum(-1, keepdims=True))
    nll = -np.take_along_axis(logp, targets[..., None], -1).mean()
    kl = (np.exp(tlogp) * (tlogp - logp)).sum(-1).mean()
    loss, (got_nll, got_kl) = distill_loss(jnp.asarray(logits), jnp.asarray(teacher_logits), jnp.asarray(targets),
                                           0.75)
    np.testing.assert_allclose([loss, got_nll, got_kl], [0.75 * kl + 0.25 * nll, nll, kl], rtol=1e-5)
    _, (_, self_kl) = distill_loss(jnp.asarray(logits), jnp.asarray(logits), jnp.asarray(targets), 1.0)
    assert abs(float(self_kl)) < 1e-6


@pytest.mark.slow  # compiles a teacher + student training step: ~2 min on the loaded 2-core machine
def test_distillation_reduces_kl_to_the_teacher(tiny_run, teacher, tmp_path):
    student = dataclasses.replace(tiny_run.model, hidden_size=16, num_layers=1, head_dim=4)
    rc = dataclasses.replace(with_train(tiny_run, distill_from=str(teacher),
                                        out_dir=str(tmp_path / "student")), model=student)
    kls = [r["kl"] for r in _rows(train(rc, progress=False)) if "kl" in r]
    assert len(kls) == 6 and kls[-1] < kls[0]


def test_init_from_starts_from_the_checkpoint_params(tiny_run, teacher, tmp_path):
    rc = with_train(tiny_run, init_from=str(teacher), out_dir=str(tmp_path / "warm"))
    started = train(rc, stop_after=0, progress=False)
    chex.assert_trees_all_equal(jax.device_get(started["params"]), load_model(teacher)[1])


def test_init_from_or_teacher_of_another_shape_raise_before_writing(tiny_run, teacher, tmp_path):
    other = dataclasses.replace(tiny_run.model, hidden_size=16, head_dim=4)
    rc = dataclasses.replace(with_train(tiny_run, init_from=str(teacher),
                                        out_dir=str(tmp_path / "a")), model=other)
    with pytest.raises(ValueError, match="init_from=.*different architecture"):
        train(rc, progress=False)
    bad_vocab = dataclasses.replace(tiny_run.model, vocab_size=tiny_run.model.vocab_size + 1)
    rc = dataclasses.replace(with_train(tiny_run, distill_from=str(teacher),
                                        out_dir=str(tmp_path / "b")), model=bad_vocab)
    with pytest.raises(ValueError, match="distill_from=.*vocab_size"):
        train(rc, progress=False)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
