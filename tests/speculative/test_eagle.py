"""The EAGLE draft (``jaxserve.speculative.eagle``): its round's cache invariant against a fill over the true
features, its fill features, its training loss, and the engine with it (greedy exact, sampling follows the target).
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxserve import LLM, SamplingParams, SpeculativeConfig
from jaxserve.models import forward_full, get_preset, init_params
from jaxserve.models.attention_backends import new_kv_pool
from jaxserve.sampling import SamplingBatch
from jaxserve.speculative.eagle import (draft_hidden, eagle_config, eagle_head, init_eagle_params, load_eagle, save_eagle,
                                       target_embed)
from jaxserve.speculative.eagle_round import draft_fill, eagle_round, fill_features
from jaxserve.speculative.generate import eagle_generate
from jaxserve.speculative.hidden import forward_with_hidden, full_hidden
from jaxserve.speculative.round import RoundInputs, multi_token_meta
from jaxserve.train.eagle import eval_metrics, make_optimizer, shifted, target_features, train_step
from spec_stats import chi2_statistic, chi2_threshold
from tests.reference_forward import reference_logits

GAMMA, BLOCK, ROUNDS = 3, 8, 6
CONFIG = get_preset("tiny-llama").replace(vocab_size=16, eos_token_id=2)
ENGINE = dict(block_size=16, max_num_seqs=4, max_num_batched_tokens=32, max_model_len=64, num_kv_blocks=32)
GREEDY = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def target():
    params = dict(jax.jit(init_params, static_argnums=0)(CONFIG, jax.random.key(0)))
    params["lm_head"] = {"kernel": params["lm_head"]["kernel"] * 20.0}  # sharp: T = 1 draws are not uniform
    return params


def _continuations(params, num, prompt_len=4, total=32, seed=5):
    """Windows i32[num, total]: random prompts and the target's greedy continuations (uncached, padded: causal)."""
    seqs = np.random.default_rng(seed).integers(0, CONFIG.vocab_size, (num, total)).astype(np.int32)
    full = jax.jit(lambda p, t: forward_full(p, CONFIG, t))
    for i in range(prompt_len, total):
        seqs[:, i] = np.argmax(np.asarray(full(params, jnp.asarray(seqs)))[:, i - 1], axis=-1)
    return seqs


@pytest.fixture(scope="module")
def trained(target):
    """A draft trained for 80 steps on the target's greedy continuations (``jaxserve.train.eagle``), and its held-out
    first-token agreement before and after."""
    config = eagle_config(CONFIG)
    windows = _continuations(target, 40)
    feats, labels = target_features(target, CONFIG, windows)
    params = init_eagle_params(config, target, jax.random.key(3))
    ids = jnp.arange(CONFIG.vocab_size, dtype=jnp.int32)
    head = eagle_head(target, CONFIG, ids)
    mask = np.ones(windows.shape, np.float32)
    mask[:, :4] = 0.0  # the prompts are random: nothing to learn there
    held = (windows[32:], feats[32:], labels[32:], head.kernel, ids, mask[32:])

    def acc1(p):
        return float(eval_metrics(p, target, *held, draft_config=config)["acc1"])
    before = acc1(params)
    optimizer = make_optimizer(3e-3, 80, 8)
    state = optimizer.init(params)
    for step in range(80):
        params, state, _ = train_step(params, state, target, windows[:32], feats[:32], labels[:32], head.kernel, ids,
                                      mask[:32], jax.random.key(step), draft_config=config, optimizer=optimizer,
                                      noise=0.0)
    return (config, params), before, acc1(params)


@pytest.fixture(scope="module")
def draft(trained):
    return trained[0]


def test_training_on_the_targets_features_raises_its_agreement(trained):
    _, before, after = trained
    assert after > max(0.5, before + 0.2), (before, after)


# The module's functions under jit (configs static): run eagerly, every primitive compiles anew for every sequence
# length the rounds grow through (1,580 compiles, ~60 s of the round test).
_eagle_round = jax.jit(eagle_round, static_argnames=("target_config", "draft_config", "gamma", "attention_impl",
                                                     "first_step"))
_forward_with_hidden = jax.jit(forward_with_hidden, static_argnums=1, static_argnames="attention_impl")
_draft_fill = jax.jit(draft_fill, static_argnums=(1, 3, 10))
_full_hidden = jax.jit(full_hidden, static_argnums=1)
_draft_hidden = jax.jit(draft_hidden, static_argnums=1)


def _inputs(positions, last, prev=0):
    b = len(positions)
    tables = np.arange(b * 4, dtype=np.int32).reshape(b, 4)
    s = SamplingBatch(temperature=np.zeros(b, np.float32), top_k=np.zeros(b, np.int32), top_p=np.ones(b, np.float32),
                      seed=np.zeros(b, np.int32), index=np.zeros(b, np.int32), position=np.zeros(b, np.int32))
    return RoundInputs(block_tables=jnp.asarray(tables), positions=jnp.asarray(positions, jnp.int32),
                       prev_tokens=jnp.full(b, prev, jnp.int32), last_tokens=jnp.asarray(last, jnp.int32),
                       active=jnp.ones(b, bool), sampling=s)


def _fill(target, draft, tokens):
    """A one-row fill over tokens from position 0: the target's and the draft's pools, the hidden at each token."""
    dconfig, dparams = draft
    pools = new_kv_pool(CONFIG, 8, BLOCK, "xla"), new_kv_pool(dconfig, 8, BLOCK, "xla")
    n = len(tokens)
    inputs = _inputs([n - 1], [0])
    meta = multi_token_meta(inputs, jnp.arange(n)[None, :], BLOCK)
    toks, pos = jnp.asarray(tokens, jnp.int32), jnp.arange(n, dtype=jnp.int32)
    logits, hidden, tpool = _forward_with_hidden(target, CONFIG, toks, pos, pools[0], meta, attention_impl="xla")
    dpool = _draft_fill(dparams, dconfig, target, CONFIG, toks, pos, hidden, jnp.zeros((1, CONFIG.hidden_size)),
                       pools[1], meta, "xla")
    return tpool, dpool, hidden, logits


def _kv_at(pool, pos, table=(0, 1, 2, 3), block=BLOCK):
    """The draft layer's K and V f32[2, K, D] at position ``pos`` of the row whose block table is ``table``
    (default: row 0 of ``_inputs``, pages 0..3)."""
    layer, page, off = pool.layers[0], table[pos // block], pos % block
    k = layer.k[page, :, :, off] if layer.k_tokens_minor else layer.k[page, off]
    return np.stack([np.asarray(k, np.float32), np.asarray(layer.v[page, off], np.float32)])


def test_a_round_leaves_the_draft_cache_a_fill_over_the_true_features_would(target, draft):
    """After a fill and greedy rounds, the draft's K/V at every position before the new last token, and the carried
    true feature, equal those of one fill over the emitted sequence (which reads only true features); a round that
    leaves its row drafted has also run the draft at the last token, as that fill would, and carries its output f̂;
    the next round skips its first draft step (``first_step=False``)."""
    dconfig, dparams = draft
    prompt = np.random.default_rng(0).integers(0, 16, 9).tolist()
    tpool, dpool, hidden, logits = _fill(target, draft, prompt)
    last = int(jnp.argmax(logits[-1]))
    head = eagle_head(target, CONFIG, np.arange(CONFIG.vocab_size))
    accepted, features, drafted, skipped, checked = [], hidden[-1:].astype(jnp.float32), jnp.zeros(1, bool), 0, []
    for _ in range(ROUNDS):  # some rounds accept part of their drafts
        first_step = not bool(drafted[0])
        skipped += not first_step
        r = _eagle_round(target, dparams, tpool, dpool, _inputs([len(prompt)], [last]), features, drafted,
                        target_config=CONFIG, draft_config=dconfig, head=head, gamma=GAMMA, attention_impl="xla",
                        first_step=first_step)
        n = int(r.num_accepted[0])
        accepted.append(n)
        prompt = prompt + [last] + np.asarray(r.tokens[0, :n]).tolist()
        last, features, drafted = int(r.next.last_tokens[0]), r.hidden[:, 1], r.drafted
        assert bool(drafted[0]) == (n < GAMMA)
        if drafted[0]:  # f̂ at the last token: the draft over the whole sequence from true features, uncached
            checked.append(_fhat_reference(target, draft, prompt + [last]))
            np.testing.assert_allclose(np.asarray(features[0]), checked[-1], atol=2e-5)
        tpool, dpool = r.target_pool, r.draft_pool
    assert 0 < sum(accepted) < ROUNDS * GAMMA, accepted  # drafts accepted and rejected: both paths ran
    assert skipped > 0 and checked, accepted
    _, ref_pool, _, _ = _fill(target, draft, prompt + [last])
    _, true_hidden = _full_hidden(target, CONFIG, jnp.asarray([prompt + [last]], jnp.int32))
    np.testing.assert_allclose(np.asarray(r.hidden[0, 0]), np.asarray(true_hidden[0, -2]), atol=1e-5)
    for pos in range(len(prompt) + bool(drafted[0])):
        np.testing.assert_allclose(_kv_at(dpool, pos), _kv_at(ref_pool, pos), atol=2e-5, err_msg=f"position {pos}")


def _fhat_reference(target, draft, tokens):
    """The draft's output at the last of ``tokens``, reading the target's true features, with no cache."""
    dconfig, dparams = draft
    seq = jnp.asarray([tokens], jnp.int32)
    _, true_hidden = _full_hidden(target, CONFIG, seq)
    fh, _ = _draft_hidden(dparams, dconfig, target_embed(target, CONFIG, seq).astype(jnp.float32),
                         shifted(true_hidden.astype(jnp.float32)), jnp.arange(seq.shape[1])[None, :])
    return np.asarray(fh[0, -1])


def test_fill_features_shift_within_each_entry():
    hidden = jnp.arange(7, dtype=jnp.float32)[:, None] * jnp.ones((1, 2))  # token i's hidden = i
    carried = jnp.asarray([[10.0, 10.0], [20.0, 20.0], [30.0, 30.0]])
    cu = jnp.asarray([0, 3, 3, 5], jnp.int32)  # entries of 3, 0 and 2 tokens; tokens 5, 6 are padding
    got = np.asarray(fill_features(hidden, carried, cu))[:, 0]
    np.testing.assert_array_equal(got, [10, 0, 1, 30, 3, 0, 0])


def test_saved_draft_loads_with_the_same_weights(tmp_path, draft):
    dconfig, dparams = draft
    dparams = jax.tree.map(lambda a: a.astype(jnp.bfloat16).astype(jnp.float32), dparams)
    save_eagle(tmp_path / "d", dconfig, dparams, [3, 1, 2], {"note": "test"})
    config, params, ids = load_eagle(tmp_path / "d")
    assert config == dconfig and ids.tolist() == [3, 1, 2]
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), params, dparams)
    with pytest.raises(ValueError, match="no EAGLE draft at"):
        load_eagle(tmp_path / "missing")


def _llm(target, draft, ids=None):
    spec = SpeculativeConfig(method="eagle", num_speculative_tokens=GAMMA)
    ids = np.arange(CONFIG.vocab_size) if ids is None else ids
    return LLM.from_params(CONFIG, target, speculative=spec, draft=(*draft, ids), **ENGINE)


def _greedy_oracle(params, prompts, steps=16):
    """The target's greedy continuations by uncached forwards, one compiled program per padded width."""
    seqs = [list(p) for p in prompts]
    for _ in range(steps):
        for s in seqs:
            s.append(int(np.argmax(reference_logits(params, CONFIG, s)[0, -1])))
    return [s[len(p):] for s, p in zip(seqs, prompts)]


def test_engine_with_an_eagle_draft_gives_the_targets_greedy_tokens(target, draft):
    rng = np.random.default_rng(1)
    prompts = [rng.integers(0, 16, n).tolist() for n in (11, 3, 7, 16, 20)]
    llm = _llm(target, draft, ids=np.arange(2, 14))  # a head cut to 12 of the 16 tokens
    warm = llm.warmup()  # every program, rounds with and without the draft's first step (rows drafted or not)
    outs = [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY, use_tqdm=False)]
    assert outs == _greedy_oracle(target, prompts)
    s = llm.stats()
    assert s["spec_rounds"] > 0 and 0.05 < s["spec_acceptance_rate"] < 0.95, s
    assert s["compilations"] == warm <= llm.engine.runner.num_buckets


def test_engine_with_an_eagle_draft_samples_from_the_target(target, draft):
    """96 requests at T = 1 with their own seeds: each token's PIT under the target's conditional is uniform."""
    rng = np.random.default_rng(7)
    prompts = [rng.integers(0, 16, int(n)).tolist() for n in rng.integers(1, 17, 96)]
    params = [SamplingParams(max_tokens=8, temperature=1.0, seed=i, ignore_eos=True) for i in range(96)]
    llm = _llm(target, draft)
    outs = llm.generate(prompts, params, use_tqdm=False)
    assert llm.stats()["spec_acceptance_rate"] < 0.9
    seqs = [(list(o.prompt_token_ids), o.outputs[0].token_ids) for o in outs]
    batch = np.array([p + t + [0] * (24 - len(p) - len(t)) for p, t in seqs], np.int32)
    probs = np.asarray(jax.nn.softmax(forward_full(target, CONFIG, jnp.asarray(batch)), axis=-1), np.float64)
    pits, rng = [], np.random.default_rng(8)
    for i, (p, t) in enumerate(seqs):
        at = np.arange(len(p), len(p) + len(t) - 1)  # probs[i, a]: the distribution of the token at a + 1
        pa, tok = probs[i, at], batch[i, at + 1]
        rows = np.arange(len(at))
        pits.append(np.cumsum(pa, 1)[rows, tok] - pa[rows, tok] + rng.random(len(at)) * pa[rows, tok])
    stat, df = chi2_statistic(np.histogram(np.concatenate(pits), bins=20, range=(0, 1))[0], np.full(20, 1 / 20))
    assert stat < chi2_threshold(df), (stat, df)


def test_plain_steps_skip_the_eagle_draft_and_rounds_catch_it_up(target, draft):
    """disable_by_batch_size=3: the batch drains 4 -> 3 -> 2, the first steps run plain without the draft's pass,
    keeping each decode's feature; the first round of each remaining sequence then runs the draft alone over the
    positions it skipped. Right after that step the draft's K/V at every position before each sequence's new last
    token (and at it, when drafted) equal a fill's over the true features; the output is the target's greedy."""
    rng = np.random.default_rng(4)
    prompts = [rng.integers(0, 16, n).tolist() for n in (3, 5, 4, 6)]
    max_tokens = [4, 16, 8, 12]
    spec = SpeculativeConfig(method="eagle", num_speculative_tokens=GAMMA, disable_by_batch_size=3)
    llm = LLM.from_params(CONFIG, target, speculative=spec, draft=(*draft, np.arange(CONFIG.vocab_size)), **ENGINE)
    warm = llm.warmup()  # the catch-up's programs too
    engine, runner = llm.engine, llm.engine.runner
    ids = [engine.add_request(p, SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True))
           for p, m in zip(prompts, max_tokens)]
    checked = 0
    while engine.has_unfinished():
        caught_up = runner.draft_catch_up_tokens
        engine.step()
        if checked or runner.draft_catch_up_tokens == caught_up:
            continue
        for seq in engine.scheduler.seqs.values():  # every running sequence: caught up, then one round
            tokens, held = seq.token_ids, runner.coverage.held(seq.seq_id, -1)
            assert held >= len(tokens) - 1, (held, len(tokens))
            _, ref_pool, _, _ = _fill(target, draft, tokens)
            table = engine.block_manager.get_block_table(seq.seq_id)
            for pos in range(held):
                np.testing.assert_allclose(_kv_at(runner.draft_pool, pos, table, ENGINE["block_size"]),
                                           _kv_at(ref_pool, pos), atol=2e-5, err_msg=f"position {pos}")
            checked += 1
    outs = [engine.finished.pop(i).outputs[0].token_ids for i in ids]
    assert outs == [row[:m] for row, m in zip(_greedy_oracle(target, prompts), max_tokens)]
    s = llm.stats()
    assert checked == 2 and s["spec_plain_steps"] > 0 and s["spec_rounds"] > 0, (checked, s)
    assert s["spec_draft_catch_up_tokens"] >= 8, s
    assert s["compilations"] == warm <= runner.num_buckets


def test_eagle_generate_in_one_while_loop_gives_the_targets_greedy_tokens(target, draft):
    rng = np.random.default_rng(2)
    lens = np.asarray([11, 3, 7])
    prompts = rng.integers(0, 16, (3, 11)).astype(np.int32)
    head = eagle_head(target, CONFIG, np.arange(2, 14))
    tokens, num, metrics = eagle_generate(target, CONFIG, draft[1], draft[0], head, prompts, lens, gamma=GAMMA,
                                          max_tokens=16)
    expected = _greedy_oracle(target, [p[:n].tolist() for p, n in zip(prompts, lens)])
    assert np.asarray(tokens).tolist() == expected and np.asarray(num).tolist() == [16] * 3
    accepted = int(np.asarray(metrics.accepted).sum())
    assert 0 < accepted < int(np.asarray(metrics.drafted).sum()), metrics


def test_eagle_settings_are_checked_before_anything_is_built(target, draft):
    dconfig, dparams = draft
    with pytest.raises(ValueError, match="needs draft_model"):
        LLM.from_params(CONFIG, target, speculative=SpeculativeConfig(method="eagle"), **ENGINE)
    with pytest.raises(ValueError, match="expects hidden_size"):
        _llm(target, (dconfig.replace(hidden_size=32), dparams))
    with pytest.raises(ValueError, match="head token ids must be distinct ids in"):
        _llm(target, draft, ids=np.asarray([1, 16]))
