"""Speculative decoding inside the engine (``LLM(speculative=SpeculativeConfig(...))``), one round per step.

Greedy outputs are checked against an uncached ``forward_full`` oracle, sampled ones with the
randomised-PIT test of ``test_generate`` under the target's exact conditionals. Every engine here
shares one model config and one engine config, so the draft-model programs compile once for the
module (compiles dominate its run time on CPU); n-gram and Medusa engines are marked slow (suffix
decoding's round programs, at γ 4 in widths 1 and 4, are two more, and the only test of the engine's host drafts).
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tokenizers

from jaxserve import LLM, SamplingParams, SpeculativeConfig
from jaxserve.engine.batching import BucketPolicy
from jaxserve.kernels.cpu import packed_impl
from jaxserve.kernels.cpu.packed import PackedBf16
from jaxserve.kernels.cpu.packed_f32 import PackedF32
from jaxserve.models import forward_full, get_preset, init_params
from jaxserve.speculative.medusa import MedusaConfig, init_medusa_params
from jaxserve.tokenizer import Tokenizer
from spec_stats import chi2_statistic, chi2_threshold

GAMMA, MAX_TOKENS, EOS = 3, 16, 2
CONFIG = get_preset("tiny-llama").replace(vocab_size=16, eos_token_id=EOS)
ENGINE = dict(block_size=16, max_num_seqs=4, max_num_batched_tokens=32, max_model_len=64, num_kv_blocks=32)
LENS = (11, 3, 7, 16)
GREEDY = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)


def _sharpened(key, factor=20.0):
    """Random params whose LM head is scaled up: at temperature 1 a random tiny model is almost
    uniform, where p and q would agree and a sampler bug could not show."""
    params = dict(jax.jit(init_params, static_argnums=0)(CONFIG, key))
    params["lm_head"] = {"kernel": params["lm_head"]["kernel"] * factor}
    return params


@jax.jit
def _perturbed(params, key):
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(key, len(leaves))
    return jax.tree.unflatten(tree, [x + 0.1 * jnp.std(x) * jax.random.normal(k, x.shape)
                                     for x, k in zip(leaves, keys)])


@pytest.fixture(scope="module")
def models():
    target = _sharpened(jax.random.key(0))
    return {"target": target, "near": _perturbed(target, jax.random.key(1)), "far": _sharpened(jax.random.key(5))}


@pytest.fixture(scope="module")
def prompts():
    rng = np.random.default_rng(0)
    return [rng.integers(0, CONFIG.vocab_size, n).tolist() for n in LENS]


_full = jax.jit(lambda params, tokens: forward_full(params, CONFIG, tokens))


def greedy_oracle(params, prompts, steps=MAX_TOKENS):
    """Greedy continuations by repeated uncached forward passes (no KV cache, no engine)."""
    width = max(48, max(map(len, prompts)) + steps)  # one shape for every call that fits 48
    seqs = [list(p) for p in prompts]
    for _ in range(steps):
        batch = np.array([s + [0] * (width - len(s)) for s in seqs], np.int32)
        logits = np.asarray(_full(params, batch))
        for i, s in enumerate(seqs):
            s.append(int(np.argmax(logits[i, len(s) - 1])))
    return [s[len(p):] for s, p in zip(seqs, prompts)]


@pytest.fixture(scope="module")
def oracle(models, prompts):
    return greedy_oracle(models["target"], prompts)


def spec_llm(models, draft="near", method="draft_model", gamma=GAMMA):
    spec = SpeculativeConfig(method=method, num_speculative_tokens=gamma)
    weights = (CONFIG, models[draft]) if method == "draft_model" else draft
    return LLM.from_params(CONFIG, models["target"], speculative=spec, draft=weights, **ENGINE)


def tokens(outs):
    return [o.outputs[0].token_ids for o in outs]


def test_greedy_engine_speculation_equals_target_greedy(models, prompts, oracle):
    llm = spec_llm(models)
    assert tokens(llm.generate(prompts, GREEDY, use_tqdm=False)) == oracle
    s = llm.stats()
    assert 0.1 < s["spec_acceptance_rate"] < 0.9, s  # partial acceptance: rollback really happens
    assert s["spec_rounds"] > 0 and len(s["spec_per_position_acceptance"]) == GAMMA
    assert s["spec_generated"] == len(prompts) * MAX_TOKENS
    assert s["compilations"] <= s["buckets"]
    # another workload may reach the small batch buckets (1, 2) as it drains; run twice, it compiles
    # only the first time, and never past one program per bucket
    other = ([p[:5] for p in prompts[:3]], SamplingParams(max_tokens=7, temperature=0.5, seed=1))
    llm.generate(*other, use_tqdm=False)
    before = llm.stats()["compilations"]
    llm.generate(*other, use_tqdm=False)
    assert llm.stats()["compilations"] == before <= s["buckets"]


def test_parallel_samples_and_prefix_cache_hits_keep_greedy_exact(models, prompts):
    long = [prompts[3] + prompts[0][:6], prompts[1]]  # 22 tokens: its first block can be a prefix-cache hit
    expected = greedy_oracle(models["target"], long)
    llm = spec_llm(models)
    assert tokens(llm.generate(long, GREEDY, use_tqdm=False)) == expected
    again = llm.generate(long, SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True, n=2),
                         use_tqdm=False)
    assert llm.stats()["prefix_cache_hit_rate"] > 0
    assert [[c.token_ids for c in o.outputs] for o in again] == [[row, row] for row in expected]


def test_eos_and_max_tokens_stop_mid_round(models, prompts, oracle):
    max_tokens = [5, 16, 10, 13]
    expected = []
    for row, cap in zip(oracle, max_tokens):
        stop = row.index(EOS) + 1 if EOS in row[:cap] else cap
        expected.append(row[:stop])
    assert any(EOS in e for e in expected) and any(EOS not in e and len(e) < MAX_TOKENS for e in expected)
    llm = spec_llm(models)
    outs = llm.generate(prompts, [SamplingParams(max_tokens=m, temperature=0.0) for m in max_tokens], use_tqdm=False)
    assert tokens(outs) == expected
    assert [o.outputs[0].finish_reason for o in outs] == ["stop" if EOS in e else "length" for e in expected]
    s = llm.stats()
    offered = len(prompts) + s["spec_rounds"] + s["spec_accepted"]  # first tokens + each round's emissions
    assert s["spec_generated"] == sum(map(len, expected)) < offered  # some round was cut short


@pytest.mark.parametrize("rule", [dict(disable_by_batch_size=3), dict(adaptive=True)], ids=["by_batch", "adaptive"])
def test_greedy_stays_exact_when_speculation_switches_off_and_on_mid_run(models, prompts, oracle, rule):
    """The batch drains 4 -> 3 -> 2 -> 1: by batch size the first steps run plain (>= 3 decodes), the rest
    speculate; the adaptive rule is made to alternate (a probe every other step). The draft's pool is kept
    in step by the plain steps, so rounds after them stay exact."""
    spec = SpeculativeConfig(num_speculative_tokens=GAMMA, **rule)
    llm = LLM.from_params(CONFIG, models["target"], speculative=spec, draft=(CONFIG, models["near"]), **ENGINE)
    if spec.adaptive:
        llm.engine.spec_policy.probe_every = 2
    max_tokens = [4, 16, 8, 12]
    outs = llm.generate(prompts, [SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True) for m in max_tokens],
                        use_tqdm=False)
    assert tokens(outs) == [row[:m] for row, m in zip(oracle, max_tokens)]
    s = llm.stats()
    assert s["spec_plain_steps"] > 0 and s["spec_speculative_steps"] > 0 and s["spec_rounds"] > 0, s
    assert s["spec_generated"] == sum(max_tokens) and s["compilations"] <= s["buckets"]


def test_plain_steps_skip_the_draft_and_rounds_catch_it_up(models, prompts):
    """disable_by_batch_size=3 with the target as its own draft: ~36 steps run plain (3-4 sequences), skipping
    the draft's pass, then two sequences speculate. Their first round first runs the draft alone over the ~36
    positions it skipped (more than the 32-token budget: several packed steps). Every draft is then accepted,
    which a draft pool missing or misplacing any position's K/V would not give; the output is the oracle's."""
    max_tokens = [40, 44, 12, 36]
    expected = [row[:m] for row, m in zip(greedy_oracle(models["target"], prompts, max(max_tokens)), max_tokens)]
    spec = SpeculativeConfig(num_speculative_tokens=GAMMA, disable_by_batch_size=3)
    llm = LLM.from_params(CONFIG, models["target"], speculative=spec, draft=(CONFIG, models["target"]), **ENGINE)
    outs = llm.generate(prompts, [SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True) for m in max_tokens],
                        use_tqdm=False)
    assert tokens(outs) == expected
    s = llm.stats()
    assert s["spec_plain_steps"] >= 30 and s["spec_rounds"] > 0, s
    assert s["spec_draft_catch_up_tokens"] > ENGINE["max_num_batched_tokens"], s
    assert s["spec_acceptance_rate"] == 1.0 and s["spec_per_position_acceptance"] == [1.0] * GAMMA, s
    assert s["compilations"] <= s["buckets"]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_draft_equal_to_target_accepts_everything(models, prompts, temperature):
    llm = spec_llm(models, draft="target")
    llm.generate(prompts, SamplingParams(max_tokens=MAX_TOKENS, temperature=temperature, seed=3, ignore_eos=True),
                 use_tqdm=False)
    s = llm.stats()
    assert s["spec_acceptance_rate"] == 1.0 and s["spec_mean_acceptance_length"] == GAMMA + 1, s
    assert s["spec_per_position_acceptance"] == [1.0] * GAMMA


def _pits(llm_outputs, params, rng):
    """Randomised PIT values of every round-generated token (all but the first) under params' conditionals."""
    seqs = [(list(o.prompt_token_ids), o.outputs[0].token_ids) for o in llm_outputs]
    width = max(len(p) + len(t) for p, t in seqs)
    batch = np.array([p + t + [0] * (width - len(p) - len(t)) for p, t in seqs], np.int32)
    probs = np.asarray(jax.nn.softmax(_full(params, batch), axis=-1), np.float64)
    out = []
    for i, (p, t) in enumerate(seqs):
        at = np.arange(len(p), len(p) + len(t) - 1)  # probs[i, a] is the distribution of the token at a + 1
        pa, tok = probs[i, at], batch[i, at + 1]
        rows = np.arange(len(at))
        out.append(np.cumsum(pa, 1)[rows, tok] - pa[rows, tok] + rng.random(len(at)) * pa[rows, tok])
    return np.concatenate(out)


def _uniformity(pits, bins=20):
    return chi2_statistic(np.histogram(pits, bins=bins, range=(0, 1))[0], np.full(bins, 1 / bins))


def test_sampling_at_temperature_one_follows_the_target(models):
    """A draft that is a different random model; 96 requests with their own seeds; p-value > 1e-4 rule."""
    rng = np.random.default_rng(7)
    prompts = [rng.integers(0, CONFIG.vocab_size, int(n)).tolist() for n in rng.integers(1, 17, 96)]
    params = [SamplingParams(max_tokens=12, temperature=1.0, seed=i, ignore_eos=True) for i in range(96)]
    llm = spec_llm(models, draft="far")
    outs = llm.generate(prompts, params, use_tqdm=False)
    assert llm.stats()["spec_acceptance_rate"] < 0.8  # the draft really differs from the target
    pits = _pits(outs, models["target"], np.random.default_rng(8))
    assert len(pits) == 96 * 11
    stat, df = _uniformity(pits)
    assert stat < chi2_threshold(df), (stat, df)
    bad, bad_df = _uniformity(_pits(outs, models["far"], np.random.default_rng(8)))  # the check has power
    assert bad > chi2_threshold(bad_df), bad


def _tokenizer(words):
    model = tokenizers.models.WordLevel({w: i for i, w in enumerate(words)}, unk_token=words[0])
    return Tokenizer(tokenizers.Tokenizer(model))


def test_bad_speculative_settings_raise_before_anything_is_built(models):
    with pytest.raises(ValueError, match="'lookahead'"):
        SpeculativeConfig(method="lookahead")
    with pytest.raises(ValueError, match="num_speculative_tokens must be an int >= 1, got 0"):
        SpeculativeConfig(num_speculative_tokens=0)
    with pytest.raises(ValueError, match="draft_matmul_dtype must be None or one of .*, got 'int8'"):
        SpeculativeConfig(draft_matmul_dtype="int8")
    with pytest.raises(ValueError, match="draft_matmul_dtype"):
        SpeculativeConfig.from_json('{"draft_matmul_dtype": "fp4"}')
    with pytest.raises(ValueError, match="draft_matmul_dtype is for method 'draft_model', got method 'ngram'"):
        SpeculativeConfig(method="ngram", draft_matmul_dtype="float32")
    spec = SpeculativeConfig(num_speculative_tokens=GAMMA)
    wide = CONFIG.replace(vocab_size=32)
    with pytest.raises(ValueError, match="draft vocab_size 32 != target vocab_size 16"):
        LLM.from_params(CONFIG, models["target"], speculative=spec, draft=(wide, None), **ENGINE)
    words = [f"w{i}" for i in range(16)]
    with pytest.raises(ValueError, match="tokenizer differs"):
        LLM.from_params(CONFIG, models["target"], _tokenizer(words), speculative=spec,
                        draft=(CONFIG, models["near"], _tokenizer(words[::-1])), **ENGINE)
    with pytest.raises(ValueError, match="needs draft_model"):
        LLM.from_params(CONFIG, models["target"], speculative=spec, **ENGINE)
    with pytest.raises(ValueError, match="max_num_batched_tokens=3 leaves no room for a speculative round of 1 \\+ 3"):
        LLM.from_params(CONFIG, models["target"], speculative=spec, draft=(CONFIG, models["near"]),
                        **{**ENGINE, "max_num_batched_tokens": 3})
    heads = MedusaConfig(CONFIG.hidden_size, CONFIG.vocab_size, num_heads=2)
    with pytest.raises(ValueError, match="num_speculative_tokens 3 exceeds the 2 medusa heads"):
        LLM.from_params(CONFIG, models["target"], draft=(heads, None), **ENGINE,
                        speculative=SpeculativeConfig(method="medusa", num_speculative_tokens=3))


def _logprob_oracle(params, prompt, output):
    """log softmax of an uncached full forward over prompt + output, at each output token."""
    seq = list(prompt) + list(output)
    logits = np.asarray(_full(params, np.array([seq + [0] * (48 - len(seq))], np.int32)))[0]
    rows = logits[len(prompt) - 1:len(seq) - 1]
    top = rows.max(-1, keepdims=True)
    lse = (top + np.log(np.exp(rows - top).sum(-1, keepdims=True)))[:, 0]
    return rows[np.arange(len(output)), output] - lse


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_logprobs_with_speculation_are_the_targets(models, prompts, oracle, temperature):
    """Each emitted token's log-probability, whether it came from a fill step or a round (accepted
    draft, correction or bonus), is the target's at that position: an uncached forward's log softmax.
    Stops cut mid-round (max_tokens 5, an EOS) keep exactly one log-probability per token."""
    llm = spec_llm(models)
    params = [SamplingParams(max_tokens=m, temperature=temperature, seed=7, logprobs=True) for m in (5, 16, 16, 12)]
    params[1] = SamplingParams(max_tokens=16, temperature=temperature, seed=7)  # not asked for: None
    outs = llm.generate(prompts, params, use_tqdm=False)
    if temperature == 0.0:
        got = [o.outputs[0].token_ids for o in outs]
        assert got == [row[:len(g)] for row, g in zip(oracle, got)]
    assert outs[1].outputs[0].logprobs is None and outs[1].outputs[0].cumulative_logprob is None
    assert llm.stats()["spec_accepted"] > 0  # some tokens did come from rounds
    for o, p in zip(outs, prompts):
        c = o.outputs[0]
        if c.logprobs is None:
            continue
        assert len(c.logprobs) == len(c.token_ids) > 0
        np.testing.assert_allclose(c.logprobs, _logprob_oracle(models["target"], p, c.token_ids), atol=2e-4)
        assert c.cumulative_logprob == pytest.approx(sum(c.logprobs), abs=1e-4)


def test_quantized_target_with_speculation_equals_the_quantized_engine(models, prompts, oracle):
    """quantization= quantizes the target and speculation keeps its greedy tokens exactly: the spec
    engine's fill and round programs run the target's matmuls under the runner's quantized settings
    (a float target would give other tokens here; the float draft is unaffected). One sequence at a
    time (max_num_seqs 1: the fewest programs to compile), the float reference is the uncached oracle
    (the float engine equals it, checked above) rather than a third engine."""
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, logprobs=True)
    spec = SpeculativeConfig(num_speculative_tokens=GAMMA)
    engine = {**ENGINE, "max_num_seqs": 1}
    quantized = LLM.from_params(CONFIG, models["target"], quantization="nvfp4", speculative=spec,
                                draft=(CONFIG, models["near"]), **engine)
    plain = LLM.from_params(CONFIG, models["target"], quantization="nvfp4", **engine)
    got, expected = (llm.generate(prompts[:2], params, use_tqdm=False) for llm in (quantized, plain))
    assert tokens(got) == tokens(expected)
    assert quantized.stats()["spec_accepted"] > 0
    lp = lambda outs: np.concatenate([o.outputs[0].logprobs for o in outs])  # noqa: E731
    np.testing.assert_allclose(lp(got), lp(expected), atol=2e-4)
    # quantization took effect: other greedy tokens than the float target's, or the float target's log-probs differ
    full = [row[:8] for row in oracle[:2]]
    full_lp = np.concatenate([_logprob_oracle(models["target"], p, t) for p, t in zip(prompts, full)])
    assert tokens(got) != full or np.abs(lp(got) - full_lp).max() > 1e-3


@pytest.mark.slow
def test_ngram_engine_greedy_equals_target_greedy(models, prompts, oracle):
    llm = spec_llm(models, draft=None, method="ngram")
    assert tokens(llm.generate(prompts, GREEDY, use_tqdm=False)) == oracle
    assert llm.stats()["spec_acceptance_rate"] > 0.1  # the tiny model repeats itself: lookup pays


def test_suffix_engine_greedy_equals_target_greedy_and_reuses_earlier_outputs(models, prompts, oracle):
    """Suffix decoding in the engine: host trees per sequence, drafts of 0..γ tokens, exact greedy tokens;
    the second run of the same prompts drafts from the first's outputs (the global tree). γ 4: rounds whose
    drafts are at most 1 token run the 1-wide program, at most 2 the 2-wide (``BucketPolicy.round_widths``)."""
    llm = spec_llm(models, draft=None, method="suffix", gamma=4)
    assert tokens(llm.generate(prompts, GREEDY, use_tqdm=False)) == oracle
    cold = llm.stats()
    assert cold["spec_method"] == "suffix" and cold["spec_rounds"] > 0
    assert cold["spec_drafted"] < cold["spec_rounds"] * 4  # adaptive: short matches draft less
    assert cold["spec_generated"] == len(prompts) * MAX_TOKENS
    assert tokens(llm.generate(prompts, GREEDY, use_tqdm=False)) == oracle
    warm = llm.stats()
    rounds = warm["spec_rounds"] - cold["spec_rounds"]
    accepted = warm["spec_accepted"] - cold["spec_accepted"]
    assert accepted / rounds > 1.5 > cold["spec_accepted"] / cold["spec_rounds"], (cold, warm)
    assert warm["compilations"] <= warm["buckets"]


def test_suffix_engine_sampling_follows_the_target(models):
    """96 requests with their own seeds, 4 at a time: later ones also draft from earlier outputs; rounds of
    width 1 and 4 (γ 4)."""
    rng = np.random.default_rng(11)
    prompts = [rng.integers(0, CONFIG.vocab_size, int(n)).tolist() for n in rng.integers(1, 17, 96)]
    params = [SamplingParams(max_tokens=12, temperature=1.0, seed=i, ignore_eos=True) for i in range(96)]
    llm = spec_llm(models, draft=None, method="suffix", gamma=4)
    outs = llm.generate(prompts, params, use_tqdm=False)
    assert llm.stats()["spec_accepted"] > 100
    stat, df = _uniformity(_pits(outs, models["target"], np.random.default_rng(12)))
    assert stat < chi2_threshold(df), (stat, df)


@pytest.mark.slow
def test_medusa_engine_greedy_equals_target_greedy(models, prompts, oracle):
    heads_config = MedusaConfig(CONFIG.hidden_size, CONFIG.vocab_size, num_heads=GAMMA)
    heads = init_medusa_params(heads_config, models["target"], CONFIG)
    heads = _perturbed(heads, jax.random.key(2))
    llm = spec_llm(models, draft=(heads_config, heads), method="medusa")
    assert tokens(llm.generate(prompts, GREEDY, use_tqdm=False)) == oracle
    assert llm.stats()["spec_rounds"] > 0


@pytest.mark.slow
def test_preemption_under_memory_pressure_keeps_greedy_exact(models, prompts, oracle):
    spec = SpeculativeConfig(num_speculative_tokens=GAMMA)
    llm = LLM.from_params(CONFIG, models["target"], speculative=spec, draft=(CONFIG, models["near"]),
                          **{**ENGINE, "num_kv_blocks": 6})  # the 4 sequences need up to 9 blocks at once
    assert tokens(llm.generate(prompts, GREEDY, use_tqdm=False)) == oracle
    assert llm.stats()["num_preemptions"] > 0


def test_warmup_compiles_every_program_a_workload_runs(models, prompts, oracle):
    """LLM.warmup on a speculative engine compiles its fill, round and copy programs (its own engine
    shape, so nothing is cached from the tests above); a workload with forks then compiles nothing,
    and the warm-up wrote nothing that changes a result."""
    spec = SpeculativeConfig(num_speculative_tokens=GAMMA)
    llm = LLM.from_params(CONFIG, models["target"], speculative=spec, draft=(CONFIG, models["near"]),
                          **{**ENGINE, "max_num_seqs": 2, "max_model_len": 48})
    warm = llm.warmup()
    assert warm == llm.stats()["compilations"] > 0
    assert tokens(llm.generate(prompts, GREEDY, use_tqdm=False)) == oracle
    forks = SamplingParams(n=2, max_tokens=MAX_TOKENS, temperature=1.0, seed=3, ignore_eos=True)
    llm.generate(prompts[:2], forks, use_tqdm=False)  # copy-on-write copies in both pools
    assert llm.stats()["compilations"] == warm


def test_draft_matmul_dtype_applies_to_the_draft_alone(models):
    """The draft's dot precision is its own (the output never depends on it): the in-memory draft is
    rounded as asked, the target keeps its float32 kernels."""
    spec = SpeculativeConfig(num_speculative_tokens=GAMMA, draft_matmul_dtype="bfloat16")
    llm = LLM.from_params(CONFIG, models["target"], speculative=spec, draft=(CONFIG, models["near"]), **ENGINE)
    proposer = llm.engine.runner.proposer
    assert proposer.config.matmul_dtype == "bfloat16" and llm.engine.runner.config.matmul_dtype is None
    mlp = proposer.params["layers_0"]["mlp"]
    if packed_impl():  # a bf16 draft's kernels packed (AMX tiles or FMAs), gate and up fused (jaxserve.kernels.cpu.packed)
        fused = mlp["gate_up_proj"]["kernel"]
        assert isinstance(fused, PackedBf16)
        kernel = fused.unpack()[:, fused.shape[1] // 2:]
    else:
        kernel = mlp["up_proj"]["kernel"]
    assert kernel.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(kernel, np.float32),
                                  np.asarray(models["near"]["layers_0"]["mlp"]["up_proj"]["kernel"].astype(jnp.bfloat16),
                                             np.float32))
    target_mlp = llm.engine.runner.params["layers_0"]["mlp"]
    if packed_impl():  # the float32 target's kernels packed as float32 (jaxserve.kernels.cpu.packed_f32), fused
        assert isinstance(target_mlp["gate_up_proj"]["kernel"], PackedF32)
        assert target_mlp["gate_up_proj"]["kernel"].data.dtype == jnp.float32
    else:
        assert target_mlp["up_proj"]["kernel"].dtype == jnp.float32


def test_a_draft_restricted_to_frequent_tokens_keeps_greedy_exact(models, prompts, oracle):
    """draft_vocab_size: the draft proposes only the 8 most frequent of 16 tokens (counts given in memory)."""
    counts = np.arange(CONFIG.vocab_size)[::-1]  # token 0 most frequent
    spec = SpeculativeConfig(num_speculative_tokens=GAMMA, draft_vocab_size=8)
    llm = LLM.from_params(CONFIG, models["target"], speculative=spec, draft=(CONFIG, models["near"], None, counts),
                          **ENGINE)
    np.testing.assert_array_equal(llm.engine.runner.proposer.head.token_ids, np.arange(8))
    assert tokens(llm.generate(prompts, GREEDY, use_tqdm=False)) == oracle
    assert 0 < llm.stats()["spec_acceptance_rate"] < 1


def test_bad_draft_vocab_settings_raise_before_anything_is_built(models):
    with pytest.raises(ValueError, match="draft_vocab_size must be None or an int >= 1 with method 'draft_model', "
                                         "got 8 with method 'ngram'"):
        SpeculativeConfig(method="ngram", draft_vocab_size=8)
    with pytest.raises(ValueError, match="got 0 with method 'draft_model'"):
        SpeculativeConfig(draft_vocab_size=0)
    spec = SpeculativeConfig(num_speculative_tokens=GAMMA, draft_vocab_size=8)
    with pytest.raises(ValueError, match="needs the draft's token counts"):
        LLM.from_params(CONFIG, models["target"], speculative=spec, draft=(CONFIG, models["near"]), **ENGINE)
    with pytest.raises(ValueError, match=r"draft_vocab_size must be an int in \[1, 16\].*got 32"):
        LLM.from_params(CONFIG, models["target"], speculative=spec.__class__(draft_vocab_size=32),
                        draft=(CONFIG, models["near"], None, np.ones(16)), **ENGINE)


def test_host_drafted_rounds_are_as_wide_as_their_longest_draft():
    """Suffix rounds verify min(width >= longest draft) slots among γ and its halves; other proposers γ."""
    def policy(gamma, narrow):
        return BucketPolicy(max_num_seqs=4, max_num_batched_tokens=32, max_model_len=64, block_size=16,
                            live_pages_only=True, lookahead=gamma, narrow_rounds=narrow)
    assert [policy(g, True).round_widths for g in (1, 2, 3, 4, 16, 20)] == [[1], [1, 2], [1, 3], [1, 2, 4],
                                                                             [1, 2, 4, 8, 16], [1, 2, 5, 10, 20]]
    p = policy(16, True)
    assert [p.round_width(n) for n in (0, 1, 2, 4, 5, 9, 16)] == [1, 1, 2, 4, 8, 16, 16]
    assert p.num_programs(True) == len(p.mixed_shapes()) + 5 * len(p.round_shapes()) + 1
    assert policy(16, False).round_widths == [16]
