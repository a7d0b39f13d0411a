"""A draft restricted to its most frequent tokens (FR-Spec): the token counts, the cut LM head, the proposals.

Exactness of the whole loop with a restricted draft is in ``test_generate`` (greedy parity, the sampled
stream's PIT test) and ``test_engine_spec`` (the engine path).
"""
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxserve import SpeculativeConfig
from jaxserve.models.checkpoint import write_manifest
from jaxserve.engine.llm import _load_proposer
from jaxserve.models import get_preset, init_params
from jaxserve.models.loading import model_path, resolve_model
from jaxserve.sampling import SamplingBatch
from jaxserve.speculative.draft_vocab import full_logits, head_logits, restrict_head
from jaxserve.models.attention_backends import new_kv_pool
from jaxserve.speculative.hidden import full_hidden
from jaxserve.speculative.rejection import round_uniforms
from jaxserve.speculative.round import RoundInputs, draft_propose
from jaxserve.speculative.token_counts import COUNTS_FILE, load_counts, most_frequent, write_counts
from tests.reference_forward import reference_logits

CONFIG = get_preset("tiny-llama").replace(vocab_size=16)
KEPT = np.array([1, 4, 5, 9, 12, 15])


@pytest.fixture(scope="module")
def params():
    return jax.jit(init_params, static_argnums=0)(CONFIG, jax.random.key(3))


def test_most_frequent_ranks_by_count_then_id():
    counts = np.array([5, 9, 0, 9, 7, 1])
    np.testing.assert_array_equal(most_frequent(counts, 3), [1, 3, 4])  # 9, 9, 7
    np.testing.assert_array_equal(most_frequent(counts, 1), [1])  # the tie goes to the lower id
    np.testing.assert_array_equal(most_frequent(counts, 6), np.arange(6))
    assert most_frequent(counts, 2).dtype == np.int32
    for bad in (0, 7, 2.5):
        with pytest.raises(ValueError, match=f"draft_vocab_size must be an int in \\[1, 6\\].*got {bad}"):
            most_frequent(counts, bad)
    with pytest.raises(ValueError, match="1-D"):
        most_frequent(counts.reshape(2, 3), 2)


def test_counts_file_round_trip_and_errors(tmp_path):
    counts = np.arange(16) * 3
    write_counts(tmp_path, counts, "test corpus")
    np.testing.assert_array_equal(load_counts(tmp_path, 16), counts)
    with pytest.raises(ValueError, match="has 16 counts; the draft's vocabulary has 32 tokens"):
        load_counts(tmp_path, 32)
    with pytest.raises(ValueError, match=str(tmp_path / "missing" / COUNTS_FILE)):
        load_counts(tmp_path / "missing", 16)


def test_restricted_logits_are_the_full_heads_at_the_kept_ids(params):
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 16, (2, 9)), jnp.int32)
    logits, hidden = full_hidden(params, CONFIG, tokens)
    head = restrict_head(CONFIG, params, KEPT[::-1])  # any order: kept sorted
    np.testing.assert_array_equal(head.token_ids, KEPT)
    hidden = hidden.reshape(-1, CONFIG.hidden_size)
    np.testing.assert_allclose(head_logits(head, hidden, CONFIG), logits.reshape(-1, 16)[:, KEPT], rtol=1e-6,
                               atol=1e-6)
    np.testing.assert_allclose(full_logits(params, CONFIG, hidden), logits.reshape(-1, 16), rtol=1e-6, atol=1e-6)
    tied = CONFIG.replace(tie_word_embeddings=True)
    tied_params = {k: v for k, v in params.items() if k != "lm_head"}
    tied_logits, tied_hidden = full_hidden(tied_params, tied, tokens)
    tied_hidden = tied_hidden.reshape(-1, CONFIG.hidden_size)
    np.testing.assert_allclose(head_logits(restrict_head(tied, tied_params, KEPT), tied_hidden, tied),
                               tied_logits.reshape(-1, 16)[:, KEPT], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(full_logits(tied_params, tied, tied_hidden), tied_logits.reshape(-1, 16), rtol=1e-6,
                               atol=1e-6)


def test_restrict_head_rejects_bad_ids(params):
    for ids in ([3, 3, 4], [-1, 2], [2, 16], []):
        with pytest.raises(ValueError, match=r"distinct ids in \[0, 16\)"):
            restrict_head(CONFIG, params, ids)


_draft_propose = jax.jit(draft_propose, static_argnums=(1, 5))  # op by op, each new shape compiles every primitive


def _propose(params, temperature, head, gamma=4, b=8):
    """γ draft steps from a two-token context per row (tokens i32[B, G], q f32[B, G, V], and the context)."""
    rng = np.random.default_rng(1)
    zero = jnp.zeros(b, jnp.int32)
    sampling = SamplingBatch(temperature=jnp.full(b, temperature), top_k=zero, top_p=jnp.ones(b),
                             seed=jnp.arange(b, dtype=jnp.uint32), index=zero, position=zero)
    inputs = RoundInputs(block_tables=jnp.arange(b, dtype=jnp.int32)[:, None], positions=zero + 1,
                         prev_tokens=jnp.asarray(rng.integers(0, 16, b), jnp.int32),
                         last_tokens=jnp.asarray(rng.integers(0, 16, b), jnp.int32), active=jnp.ones(b, bool),
                         sampling=sampling)
    u = round_uniforms(sampling.seed, sampling.index, inputs.positions + 1, gamma, 16, jnp.bool_(temperature == 0))
    pool = new_kv_pool(CONFIG, b, 16, "auto")
    x, q, _ = _draft_propose(params, CONFIG, pool, inputs, u[:, :gamma, :-1], "auto", head)
    return np.asarray(x), np.asarray(q), jnp.stack([inputs.prev_tokens, inputs.last_tokens], axis=1)


def test_greedy_rounds_propose_the_best_kept_token(params):
    x, _, context = _propose(params, 0.0, restrict_head(CONFIG, params, KEPT))
    assert np.isin(x, KEPT).all()
    full = reference_logits(params, CONFIG, jnp.concatenate([context, jnp.asarray(x[:, :-1])], axis=1))
    np.testing.assert_array_equal(x, KEPT[np.argmax(np.asarray(full)[:, 1:, KEPT], axis=-1)])
    assert not np.isin(_propose(params, 0.0, None)[0], KEPT).all()  # unrestricted, it proposes others here


def test_sampled_rounds_draw_from_the_whole_vocabulary(params):
    """A round with a sampled row keeps the full head (restricted sampling costs acceptance): the same
    proposals and distributions as the unrestricted draft, up to float rounding."""
    x, q, _ = _propose(params, 1.0, restrict_head(CONFIG, params, KEPT))
    x0, q0, _ = _propose(params, 1.0, None)
    np.testing.assert_array_equal(x, x0)
    np.testing.assert_allclose(q, q0, rtol=1e-5, atol=1e-7)
    assert not np.isin(x, KEPT).all()


def test_the_zoo_draft_restricted_through_speculative_config():
    spec = SpeculativeConfig(draft_model="jaxserve/tiny-code-draft", draft_vocab_size=1024)
    config, params, tokenizer = resolve_model("jaxserve/tiny-code")
    proposer = _load_proposer(spec, config, tokenizer, None, None)
    counts = load_counts(model_path("jaxserve/tiny-code-draft"), 4096)
    np.testing.assert_array_equal(proposer.head.token_ids, most_frequent(counts, 1024))
    assert proposer.head.kernel.shape == (proposer.config.hidden_size, 1024)
    assert counts.sum() > 2_000_000  # the pycode-v1 training split, not a stub


def test_a_draft_directory_without_counts_is_an_error_naming_the_file(tmp_path):
    draft = tmp_path / "draft"
    shutil.copytree(model_path("jaxserve/tiny-code-draft"), draft, ignore=shutil.ignore_patterns(COUNTS_FILE))
    write_manifest(draft)  # a checkpoint saved without counts, not a damaged copy of the zoo draft
    config, _, tokenizer = resolve_model("jaxserve/tiny-code")
    spec = SpeculativeConfig(draft_model=str(draft), draft_vocab_size=1024)
    with pytest.raises(ValueError, match=str(draft / COUNTS_FILE)):
        _load_proposer(spec, config, tokenizer, None, None)
