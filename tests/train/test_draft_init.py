"""The projected-embedding start of a narrow tied draft (jaxserve.train.draft_init)."""
import dataclasses

import jax
import numpy as np
import pytest

from jaxserve.models import get_preset, init_params
from jaxserve.train.draft_init import init_draft, projected_embedding


def test_full_width_projection_keeps_every_inner_product():
    e = np.random.default_rng(0).normal(size=(300, 24)).astype(np.float32)
    p = projected_embedding(e, 24)
    np.testing.assert_allclose(p @ p.T, e @ e.T, rtol=1e-4, atol=1e-4)


def test_narrow_projection_is_the_best_rank_k_gram_approximation():
    rng = np.random.default_rng(1)
    e = (rng.normal(size=(400, 32)) * np.linspace(3, 0.1, 32)).astype(np.float32)
    p = projected_embedding(e, 8)
    err = np.linalg.norm(e @ e.T - p @ p.T)
    sv = np.linalg.svd(e, compute_uv=False)
    np.testing.assert_allclose(err, np.sqrt(np.sum(sv[8:] ** 4)), rtol=1e-3)  # Eckart-Young
    q, _ = np.linalg.qr(rng.normal(size=(32, 8)))
    assert err < np.linalg.norm(e @ e.T - (e @ q) @ (e @ q).T)  # any other rank-8 projection is worse


def test_init_draft_takes_the_targets_projected_embedding_and_checks_shapes():
    target = get_preset("tiny-qwen3")  # tied, vocab 512, hidden 64
    tparams = jax.tree.map(np.asarray, init_params(target, jax.random.key(0)))
    draft = dataclasses.replace(target, hidden_size=16, num_layers=1, head_dim=8, intermediate_size=32)
    params = init_draft(draft, tparams, target, seed=0)
    assert params["embed"]["embedding"].shape == (512, 16)
    np.testing.assert_allclose(params["embed"]["embedding"], projected_embedding(tparams["embed"]["embedding"], 16))
    with pytest.raises(ValueError, match="tied embeddings"):
        init_draft(dataclasses.replace(draft, tie_word_embeddings=False), tparams, target, seed=0)
    with pytest.raises(ValueError, match="vocab_size 256 != target's 512"):
        init_draft(dataclasses.replace(draft, vocab_size=256), tparams, target, seed=0)
    with pytest.raises(ValueError, match=r"draft hidden size must lie in \[1, 64\]"):
        projected_embedding(tparams["embed"]["embedding"], 65)
