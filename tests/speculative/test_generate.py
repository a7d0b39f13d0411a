"""speculative_generate / ngram_generate / suffix_generate against target_only_generate: greedy parity, stopping,
metrics, compiles, jaxpr, and end-to-end exactness when sampling.

Every call here shares one shape bucket (batch 4, prompt 16, output 16, γ 3) and one config, so
the module compiles each of the three programs once (compiles dominate its run time on CPU).
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxserve.models import forward_full, get_preset, init_params
from jaxserve.models.loading import with_matmul_dtype
from jaxserve.speculative import generate as gen
from jaxserve.speculative.draft_vocab import restrict_head
from jaxserve.speculative.generate import ngram_generate, speculative_generate, suffix_generate, target_only_generate
from jaxserve.speculative.suffix_tree import SuffixCache
from jaxserve.speculative.metrics import summarize
from jaxserve.speculative.rejection import probs_from_logits
from tests.reference_forward import reference_logits
from spec_stats import chi2_statistic, chi2_threshold

GAMMA, MAX_TOKENS = 3, 16
CONFIG = get_preset("tiny-llama").replace(vocab_size=16)
LENS = np.array([11, 3, 7, 16])


@jax.jit
def perturbed(params, scale, seed):
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    noisy = [x + scale * jnp.std(x) * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)]
    return jax.tree.unflatten(tree, noisy)


@pytest.fixture(scope="module")
def models():
    target = jax.jit(init_params, static_argnums=0)(CONFIG, jax.random.key(0))
    return target, perturbed(target, 0.1, 1)  # a draft that agrees with the target about half the time


@pytest.fixture(scope="module")
def prompts():
    return np.random.default_rng(0).integers(0, CONFIG.vocab_size, (4, 16))


@pytest.fixture(scope="module")
def reference(models, prompts):
    tokens, n, _ = target_only_generate(models[0], CONFIG, prompts, LENS, max_tokens=MAX_TOKENS)
    assert (np.asarray(n) == MAX_TOKENS).all()
    return np.asarray(tokens)


def spec(models, prompts, lens=LENS, draft=None, **kw):
    target, default_draft = models
    kw = {"gamma": GAMMA, "max_tokens": MAX_TOKENS, **kw}
    tokens, n, metrics = speculative_generate(target, CONFIG, default_draft if draft is None else draft, CONFIG,
                                              prompts, lens, **kw)
    return np.asarray(tokens), np.asarray(n), metrics


def test_greedy_speculative_equals_target_only(models, prompts, reference):
    tokens, n, metrics = spec(models, prompts)
    np.testing.assert_array_equal(tokens, reference)
    np.testing.assert_array_equal(n, MAX_TOKENS)
    accepted = np.asarray(metrics.accepted)
    s = summarize(metrics)
    assert 0.1 < s["acceptance_rate"] < 0.9, s  # partial acceptance, so rollback really happens
    assert len(set(accepted.tolist())) > 1, accepted  # rows accept different amounts


def test_greedy_parity_holds_with_bfloat16_matmuls(models, prompts):
    """Both models with bf16 dot operands (the experiment's default): the verify's multi-row dots and the
    decode step's one-row dots round the same operands, so greedy parity still holds token for token."""
    config, target = with_matmul_dtype(CONFIG, models[0], "bfloat16")
    _, draft = with_matmul_dtype(CONFIG, models[1], "bfloat16")
    base, _, _ = target_only_generate(target, config, prompts, LENS, max_tokens=MAX_TOKENS)
    tokens, n, metrics = speculative_generate(target, config, draft, config, prompts, LENS, gamma=GAMMA,
                                              max_tokens=MAX_TOKENS)
    np.testing.assert_array_equal(np.asarray(tokens), np.asarray(base))
    assert 0.1 < summarize(metrics)["acceptance_rate"] < 0.9
    logits = reference_logits(target, config, prompts)
    assert np.abs(np.asarray(logits) - reference_logits(models[0], CONFIG, prompts)).max() > 1e-5


def test_greedy_parity_holds_with_a_float32_draft_beside_bfloat16_matmuls(models, prompts):
    """The draft's precision is its own (``SpeculativeConfig.draft_matmul_dtype``): a float32 draft next to a
    bf16-matmul target, and the output is still the target's, token for token."""
    config, target = with_matmul_dtype(CONFIG, models[0], "bfloat16")
    base, _, _ = target_only_generate(target, config, prompts, LENS, max_tokens=MAX_TOKENS)
    tokens, _, metrics = speculative_generate(target, config, models[1], CONFIG, prompts, LENS, gamma=GAMMA,
                                              max_tokens=MAX_TOKENS)
    np.testing.assert_array_equal(np.asarray(tokens), np.asarray(base))
    assert 0.1 < summarize(metrics)["acceptance_rate"] < 0.9


def _truncate(reference, eos, max_tokens):
    out, counts = np.full_like(reference, -1), []
    for r, row in enumerate(reference):
        stop = int(max_tokens[r])
        hits = np.flatnonzero(row[:stop] == eos)
        stop = hits[0] + 1 if len(hits) else stop
        out[r, :stop] = row[:stop]
        counts.append(stop)
    return out, np.array(counts)


def test_eos_and_max_tokens_stop_mid_round(models, prompts, reference):
    eos = int(reference[1, 6])  # appears mid-stream in row 1, maybe elsewhere too
    max_tokens = np.array([5, 16, 10, 13])
    expected, counts = _truncate(reference, eos, max_tokens)
    assert counts.min() < MAX_TOKENS - GAMMA
    tokens, n, metrics = spec(models, prompts, max_tokens=max_tokens, eos_token_id=eos)
    base, base_n, _ = target_only_generate(models[0], CONFIG, prompts, LENS, max_tokens=max_tokens, eos_token_id=eos)
    np.testing.assert_array_equal(n, counts)
    np.testing.assert_array_equal(tokens[:, :counts.max()], expected[:, :counts.max()])
    np.testing.assert_array_equal(np.asarray(base_n), counts)
    np.testing.assert_array_equal(np.asarray(base)[:, :counts.max()], expected[:, :counts.max()])
    # some row stopped inside a round: it was offered more tokens than it kept
    offered = 1 + np.asarray(metrics.rounds) + np.asarray(metrics.accepted)
    assert (offered > n).any() and (np.asarray(metrics.generated) == n).all()


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_draft_equal_to_target_accepts_everything(models, prompts, temperature):
    target = models[0]
    _, n, metrics = spec(models, prompts, draft=target, temperature=temperature, seeds=np.arange(4))
    s = summarize(metrics)
    assert s["acceptance_rate"] == 1.0 and s["mean_acceptance_length"] == GAMMA + 1, s
    assert s["per_position_acceptance"] == [1.0] * GAMMA
    rounds = -(-(MAX_TOKENS - 1) // (GAMMA + 1))  # the first token comes from the prefill
    np.testing.assert_array_equal(np.asarray(metrics.rounds), rounds)
    assert s["target_calls_per_token"] == (1 + rounds) / MAX_TOKENS


def test_rows_are_independent_of_their_batch(models, prompts, reference):
    """A row's tokens depend on its own seed only; greedy and sampled rows mix in one batch."""
    temps, seeds = np.array([1.0, 0.0, 0.8, 1.0]), np.array([11, 12, 13, 14])
    tokens, n, _ = spec(models, prompts, temperature=temps, seeds=seeds, top_k=np.array([0, 0, 5, 0]),
                        top_p=np.array([1.0, 1.0, 1.0, 0.9]))
    np.testing.assert_array_equal(tokens[1], reference[1])
    order = np.array([3, 0, 2])  # a smaller batch (same bucket), rows moved
    again, _, _ = spec(models, prompts[order], lens=LENS[order], temperature=temps[order], seeds=seeds[order],
                       top_k=np.array([0, 0, 5]), top_p=np.array([0.9, 1.0, 1.0]))
    np.testing.assert_array_equal(again, tokens[order])
    other, _, _ = spec(models, prompts, temperature=temps, seeds=seeds + 1, top_k=np.array([0, 0, 5, 0]),
                       top_p=np.array([1.0, 1.0, 1.0, 0.9]))
    assert (other[[0, 2, 3]] != tokens[[0, 2, 3]]).any()


def test_one_compile_per_bucket_and_gamma(models, prompts):
    spec(models, prompts)
    before = gen.TRACES["speculative"]
    spec(models, prompts[:3], lens=np.array([16, 2, 9]), max_tokens=np.array([9, 3, 12]), temperature=0.7,
         top_k=4, seeds=np.array([1, 2, 3]), eos_token_id=3)
    spec(models, prompts[:, :9], lens=np.array([9, 1, 4, 5]), max_tokens=11, top_p=0.5)
    assert gen.TRACES["speculative"] == before
    # a new γ or batch bucket is a new program: trace it (without compiling) to show the count moves
    for gamma, rows in [(2, 4), (GAMMA, 5)]:
        arrays, static, _, _ = gen._prepare(CONFIG, CONFIG, np.resize(prompts, (rows, 16)), np.resize(LENS, rows),
                                            gamma, MAX_TOKENS, 0.0, 0, 1.0, 0, None, 16)
        jax.eval_shape(lambda a: gen._speculative_program(*models, **a, target_config=CONFIG, draft_config=CONFIG,
                                                          attention_impl="auto", **static), arrays)
    assert gen.TRACES["speculative"] == before + 2


def _equations(jaxpr, out):
    """Every equation of jaxpr and of its sub-jaxprs, depth first."""
    for eqn in jaxpr.eqns:
        out.append(eqn)
        for value in eqn.params.values():
            for sub in value if isinstance(value, (tuple, list)) else [value]:
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    _equations(inner, out)
    return out


@pytest.mark.parametrize("program", ["_speculative_program", "_target_only_program"])
def test_one_while_loop_and_no_host_callbacks(models, prompts, program):
    arrays, static, _, _ = gen._prepare(CONFIG, CONFIG, prompts, LENS, GAMMA, MAX_TOKENS, 1.0, 0, 1.0, 0, 5, 16)
    fn = getattr(gen, program)
    jaxpr = jax.make_jaxpr(lambda a: fn(*models, **a, target_config=CONFIG, draft_config=CONFIG,
                                        attention_impl="auto", **static))(arrays)
    eqns = _equations(jaxpr.jaxpr, [])
    # Attention may walk pages with counted fori_loops; the generation loop is the one while whose
    # condition looks at data (``any(~done)``), not at a counter.
    conds = [{e.primitive.name for e in w.params["cond_jaxpr"].jaxpr.eqns} for w in eqns if w.primitive.name == "while"]
    assert sum("reduce_or" in c for c in conds) == 1, conds
    names = [e.primitive.name for e in eqns]
    assert not [n for n in names if "callback" in n or "outfeed" in n or "infeed" in n]
    assert "callback" not in str(jaxpr)


def test_bad_inputs_raise_before_running(models, prompts):
    with pytest.raises(ValueError, match=r"prompt_lens must lie in \[1, 16\]"):
        spec(models, prompts, lens=np.array([0, 3, 7, 16]))
    with pytest.raises(ValueError, match="gamma must be >= 1, got 0"):
        spec(models, prompts, gamma=0)
    with pytest.raises(ValueError, match="draft vocab_size 32 != target vocab_size 16"):
        speculative_generate(models[0], CONFIG, models[1], CONFIG.replace(vocab_size=32), prompts, LENS)
    with pytest.raises(ValueError, match="exceeds max_position_embeddings 512"):
        spec(models, prompts, max_tokens=500)


TEMPS, TOP_K, TOP_P = np.array([0.1, 0.1, 1.0, 0.3]), np.array([0, 6, 0, 0]), np.array([1.0, 1.0, 0.8, 1.0])


@jax.jit
def _conditionals(params, batch, temperature, top_k, top_p):
    """Target sampling distributions f32[S, L, V] after every prefix of batch i32[S, L], per-row settings."""
    logits = forward_full(params, CONFIG, batch)
    s, length, v = logits.shape
    rep = lambda x: jnp.repeat(x, length)  # noqa: E731
    return probs_from_logits(logits.reshape(-1, v), rep(temperature), rep(top_k), rep(top_p)).reshape(s, length, v)


def _stream_pits(generate, target, calls):
    """Randomised PIT values of every round-generated token under the target's exact conditionals.

    If each token is drawn from p(. | prefix), the values F(t-1) + U p(t) are i.i.d. uniform on
    [0, 1) (Rosenblatt), whatever the prompts, settings and acceptance pattern.
    """
    rng = np.random.default_rng(9)
    seqs, starts, counts = [], [], []
    for c in range(calls):
        prompts = rng.integers(0, CONFIG.vocab_size, (4, 16))
        lens = rng.integers(1, 17, 4)
        tokens, n = generate(prompts, lens, seeds=np.arange(4) + 4 * c)
        for r in range(4):
            seqs.append(np.concatenate([prompts[r, :lens[r]], tokens[r, :n[r]]]))
            starts.append(lens[r])
            counts.append(n[r])
    width = 16 + MAX_TOKENS  # one shape for every call of _conditionals
    batch = np.stack([np.pad(s, (0, width - len(s))) for s in seqs])
    probs = np.asarray(_conditionals(target, jnp.asarray(batch, jnp.int32), jnp.asarray(np.tile(TEMPS, calls)),
                                     jnp.asarray(np.tile(TOP_K, calls)), jnp.asarray(np.tile(TOP_P, calls))),
                       np.float64)  # probs[i, t] is the target's distribution of token t + 1 of sequence i
    pits = []
    for i, (seq, start, n) in enumerate(zip(seqs, starts, counts)):
        at = np.arange(start, start + n - 1)  # tokens from rounds (the first comes from the prefill)
        p, tok = probs[i, at], seq[at + 1]
        before = np.cumsum(p, 1)[np.arange(len(at)), tok] - p[np.arange(len(at)), tok]
        pits.append(before + rng.random(len(at)) * p[np.arange(len(at)), tok])
    return np.concatenate(pits)


def _uniformity(pits, bins=20):
    counts = np.histogram(pits, bins=bins, range=(0, 1))[0]
    return chi2_statistic(counts, np.full(bins, 1 / bins))


def test_sampled_stream_follows_the_target_end_to_end(models, prompts):
    """Temperature / top-k / top-p rows, a draft that is a different random model: tokens ~ target."""
    target = models[0]
    other = perturbed(jax.jit(init_params, static_argnums=0)(CONFIG, jax.random.key(5)), 0.0, 0)

    def spec_gen(p, lens, seeds):
        tokens, n, _ = speculative_generate(target, CONFIG, other, CONFIG, p, lens, gamma=GAMMA,
                                            max_tokens=MAX_TOKENS, temperature=TEMPS, top_k=TOP_K, top_p=TOP_P,
                                            seeds=seeds)
        return np.asarray(tokens), np.asarray(n)

    def draft_only(p, lens, seeds):
        tokens, n, _ = target_only_generate(other, CONFIG, p, lens, max_tokens=MAX_TOKENS, temperature=TEMPS,
                                            top_k=TOP_K, top_p=TOP_P, seeds=seeds)
        return np.asarray(tokens), np.asarray(n)

    pits = _stream_pits(spec_gen, target, calls=60)
    assert len(pits) > 3000
    stat, df = _uniformity(pits)
    assert stat < chi2_threshold(df), (stat, df)
    bad, bad_df = _uniformity(_stream_pits(draft_only, target, calls=60))  # the check has power
    assert bad > chi2_threshold(bad_df), bad


def test_ngram_greedy_equals_target_only_and_exact_when_sampling(models, prompts, reference):
    target = models[0]
    tokens, n, metrics = ngram_generate(target, CONFIG, prompts, LENS, gamma=GAMMA, max_tokens=MAX_TOKENS)
    np.testing.assert_array_equal(np.asarray(tokens), reference)
    assert summarize(metrics)["acceptance_rate"] > 0.2  # the tiny model repeats itself, lookup pays

    def ngram_gen(p, lens, seeds):
        tokens, n, _ = ngram_generate(target, CONFIG, p, lens, gamma=GAMMA, max_tokens=MAX_TOKENS,
                                      temperature=TEMPS, top_k=TOP_K, top_p=TOP_P, seeds=seeds)
        return np.asarray(tokens), np.asarray(n)

    stat, df = _uniformity(_stream_pits(ngram_gen, target, calls=60))
    assert stat < chi2_threshold(df), (stat, df)


def test_a_whole_vocabulary_draft_head_changes_nothing(models, prompts):
    """restrict_head over every id: the same draft logits, so the same tokens and acceptance, greedy and sampled."""
    head = restrict_head(CONFIG, models[1], np.arange(CONFIG.vocab_size))
    for kw in ({}, {"temperature": TEMPS, "top_k": TOP_K, "top_p": TOP_P, "seeds": np.arange(4)}):
        plain, headed = spec(models, prompts, **kw), spec(models, prompts, draft_head=head, **kw)
        np.testing.assert_array_equal(plain[0], headed[0])
        assert summarize(plain[2]) == summarize(headed[2])


def test_a_restricted_draft_keeps_greedy_parity_and_the_sampled_stream_exact(models, prompts, reference):
    """The draft proposes only 8 of 16 tokens in greedy rounds: greedy output is still the target's token for
    token, and sampled tokens (rounds that draft from the whole head) still follow the target's conditionals."""
    target, draft = models
    head = restrict_head(CONFIG, draft, np.arange(0, CONFIG.vocab_size, 2))
    tokens, n, metrics = spec(models, prompts, draft_head=head)
    np.testing.assert_array_equal(tokens, reference)
    assert 0 < summarize(metrics)["acceptance_rate"] < 1

    def spec_gen(p, lens, seeds):
        tokens, n, _ = speculative_generate(target, CONFIG, draft, CONFIG, p, lens, gamma=GAMMA, max_tokens=MAX_TOKENS,
                                            temperature=TEMPS, top_k=TOP_K, top_p=TOP_P, seeds=seeds, draft_head=head)
        return np.asarray(tokens), np.asarray(n)

    pits = _stream_pits(spec_gen, target, calls=60)
    assert len(pits) > 3000
    stat, df = _uniformity(pits)
    assert stat < chi2_threshold(df), (stat, df)


def test_a_bad_draft_head_raises_before_running(models, prompts):
    head = restrict_head(CONFIG, models[1], np.arange(4))
    with pytest.raises(ValueError, match="draft_head must be a DraftHead"):
        spec(models, prompts, draft_head=(head.token_ids, head.kernel))
    with pytest.raises(ValueError, match=r"draft_head has 4 tokens and a \(8, 4\) kernel"):
        spec(models, prompts, draft_head=head.replace(kernel=jnp.zeros((8, 4))))


def test_suffix_greedy_equals_target_only_and_earlier_outputs_pay(models, prompts, reference):
    """Suffix decoding: exact greedy tokens; a second call sharing the cache drafts from the first's
    outputs (its global tree), so it accepts more; drafted counts the real (adaptive) lengths."""
    target = models[0]
    cache = SuffixCache(max_depth=16)
    first = [suffix_generate(target, CONFIG, prompts, LENS, gamma=GAMMA, max_tokens=MAX_TOKENS, cache=cache)
             for _ in range(2)]
    for tokens, n, _ in first:
        np.testing.assert_array_equal(np.asarray(tokens), reference)
        np.testing.assert_array_equal(np.asarray(n), MAX_TOKENS)
    cold, warm = (summarize(m) for _, _, m in first)
    assert cache.num_cached == 8 and warm["mean_acceptance_length"] > cold["mean_acceptance_length"]
    assert cold["drafted"] < cold["rounds"] * GAMMA  # short matches draft fewer than γ
    assert warm["acceptance_rate"] > 0.9 and warm["target_calls_per_token"] < 0.5, warm
    assert gen.TRACES["suffix_round"] <= 3  # round widths 1, 2, 3 (γ): reused round after round


def test_suffix_sampled_stream_follows_the_target(models):
    target = models[0]
    cache = SuffixCache(max_depth=16)  # shared: later calls also draft from earlier calls' outputs
    accepted = []

    def suffix_gen(p, lens, seeds):
        tokens, n, metrics = suffix_generate(target, CONFIG, p, lens, gamma=GAMMA, max_tokens=MAX_TOKENS,
                                             temperature=TEMPS, top_k=TOP_K, top_p=TOP_P, seeds=seeds, cache=cache)
        accepted.append(summarize(metrics)["accepted"])
        return np.asarray(tokens), np.asarray(n)

    stat, df = _uniformity(_stream_pits(suffix_gen, target, calls=60))
    assert stat < chi2_threshold(df), (stat, df)
    assert sum(accepted) > 300  # many tokens did come from accepted drafts


def test_suffix_generate_rejects_a_bad_cache(models, prompts):
    with pytest.raises(ValueError, match="cache must be a SuffixCache or None, got dict"):
        suffix_generate(models[0], CONFIG, prompts, LENS, cache={})
