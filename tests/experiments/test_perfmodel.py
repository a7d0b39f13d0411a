"""The roofline model (perfmodel.py of the blackwell_roofline experiment): hand-computed cases, closed forms,
invariants, published totals."""
import numpy as np
import pytest

from experiments.blackwell_roofline import perfmodel as pm

MODELS = list(pm.MODELS.values())
HARDWARE = list(pm.HARDWARE.values())


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.name)
def test_param_counts_within_2pct_of_published(model):
    assert model.total_params() == pytest.approx(model.published_total_params, rel=0.02)
    assert model.active_params() == pytest.approx(model.published_active_params, rel=0.02)


def test_llama3_70b_params_and_kv_by_hand():
    h, i, v, kv = 8192, 28672, 128256, 8 * 128
    per_layer = 2 * h * h + 2 * h * kv + 3 * h * i + 2 * h  # q, o; k, v; gate, up, down; two norms
    assert pm.LLAMA3_70B.total_params() == 80 * per_layer + h + 2 * v * h
    assert pm.kv_bytes_per_token(pm.LLAMA3_70B, pm.PRECISIONS["bf16"]) == 2 * 80 * kv * 2  # 320 KiB


def test_mla_kv_is_latent_plus_rope_key():
    # DeepSeek-V3 caches 512 + 64 numbers per token and layer, not 2 x 128 heads x 128
    assert pm.kv_bytes_per_token(pm.DEEPSEEK_V3, pm.PRECISIONS["bf16"]) == 61 * 576 * 2
    assert pm.kv_bytes_per_token(pm.DEEPSEEK_V3, pm.PRECISIONS["nvfp4"]) == 61 * 576 * 4.5 / 8
    assert pm.kv_shards(pm.DEEPSEEK_V3, 8) == 1 and pm.kv_shards(pm.LLAMA3_70B, 16) == 8


def test_bandwidth_bound_tokens_per_s_is_bandwidth_over_bytes():
    m, hw, prec = pm.LLAMA3_70B, pm.H100_SXM, pm.PRECISIONS["fp8"]
    # batch 1, no context: every weight but the input embedding, blocks in fp8, head/norms in bf16
    head = m.vocab_size * m.hidden_size + m.norm_params()
    nbytes = (m.total_params() - m.vocab_size * m.hidden_size - head) * 1 + head * 2
    est = pm.decode_step(m, hw, prec, batch=1, context=0)
    assert est.bound == "memory" and est.comm_s == 0
    assert est.weight_bytes == pytest.approx(nbytes)
    assert est.tokens_per_s_per_gpu == pytest.approx(3.35e12 / nbytes)
    with_kv = pm.decode_step(m, hw, prec, batch=4, context=1000)
    assert with_kv.kv_bytes == 4 * 1000 * 2 * 80 * 8 * 128 * 1
    assert with_kv.step_s == pytest.approx((nbytes + with_kv.kv_bytes) / 3.35e12)


@pytest.mark.parametrize("context", [0, 512])
def test_ridge_point_matches_closed_form_for_dense(context):
    m, hw, prec = pm.LLAMA3_70B, pm.B200, pm.PRECISIONS["bf16"]
    one = pm.decode_step(m, hw, prec, batch=1, context=context)
    w = one.weight_bytes  # independent of batch for a dense model
    flops_per_token, kv_per_token = one.flops, one.kv_bytes
    # b * flops / F = (w + b * kv) / BW
    expected = (w / hw.mem_bw) / (flops_per_token / hw.bf16_flops - kv_per_token / hw.mem_bw)
    assert pm.ridge_batch(m, hw, prec, context) == pytest.approx(expected, rel=1e-6)
    if context == 0:  # the textbook form: (peak / bandwidth) x bytes per weight / 2, nearly
        assert expected == pytest.approx(hw.bf16_flops / hw.mem_bw, rel=0.03)


def test_long_context_gqa_decode_never_turns_compute_bound():
    # 4096 x 320 KiB of KV per sequence outweighs its 140 GFLOPs on an H100
    assert pm.ridge_batch(pm.LLAMA3_70B, pm.H100_SXM, pm.PRECISIONS["bf16"], context=4096) is None


@pytest.mark.parametrize("hw", HARDWARE, ids=lambda h: h.name)
@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.name)
def test_monotone_in_batch(model, hw):
    prec = pm.PRECISIONS["fp8"]
    est = [pm.decode_step(model, hw, prec, b, 2048, tp=8) for b in 2 ** np.arange(12)]
    steps = [e.step_s for e in est]
    rates = [e.tokens_per_s_per_gpu for e in est]
    assert steps == sorted(steps) and rates == sorted(rates)
    bytes_read = [e.weight_bytes for e in est]
    assert bytes_read == sorted(bytes_read)  # MoE touches more experts as the batch grows


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.name)
def test_fewer_bits_fewer_bytes_more_tokens(model):
    order = ["bf16", "fp8", "nvfp4", "mxfp4"]
    mem = [pm.weight_memory(model, pm.PRECISIONS[f]) for f in order]
    rate = [pm.decode_step(model, pm.B200, pm.PRECISIONS[f], 1, 1024, tp=8).tokens_per_s_per_gpu for f in order]
    assert mem == sorted(mem, reverse=True) and rate == sorted(rate)
    cap = [pm.kv_capacity(model, pm.B200, pm.PRECISIONS[f], 4096, tp=8) for f in order]
    assert cap == sorted(cap)


def test_kv_capacity_by_hand_and_monotone():
    m, hw, prec = pm.MIXTRAL_8X7B, pm.H200, pm.PRECISIONS["bf16"]
    free = 0.9 * 141e9 - pm.weight_memory(m, prec)
    assert pm.kv_capacity(m, hw, prec, 1000) == int(free // (1000 * 2 * 32 * 8 * 128 * 2))
    caps = [pm.kv_capacity(m, hw, prec, c) for c in (512, 1024, 4096, 32768)]
    assert caps == sorted(caps, reverse=True)
    assert pm.kv_capacity(m, hw, prec, 4096, tp=2) > pm.kv_capacity(m, hw, prec, 4096, tp=1)
    assert pm.kv_capacity(pm.DEEPSEEK_V3, hw, prec, 4096) == 0  # 1.3 TB of weights on one GPU


def test_min_tp():
    bf16 = pm.PRECISIONS["bf16"]
    assert pm.min_tp(pm.LLAMA3_70B, pm.H100_SXM, bf16, 4096) == 2  # 141 GB of weights
    assert pm.min_tp(pm.LLAMA3_70B, pm.B200, bf16, 4096) == 1
    assert pm.min_tp(pm.DEEPSEEK_V3, pm.H200, pm.PRECISIONS["fp8"], 4096) == 8  # its FP8 release on 8 x H200
    with pytest.raises(ValueError, match="does not fit"):
        pm.min_tp(pm.DEEPSEEK_V3, pm.H100_SXM, bf16, 4096, max_tp=8)


def test_expected_experts_touched_matches_simulation():
    rng = np.random.default_rng(0)
    e, k = 8, 2
    for b in (1, 3, 10):
        picks = rng.random((4000, b, e)).argsort(-1)[..., :k]  # k distinct experts per token
        touched = np.zeros((4000, e), bool)
        np.put_along_axis(touched, picks.reshape(4000, b * k), True, axis=1)
        sim = touched.sum(1).mean()
        assert pm.expected_experts_touched(e, k, b) == pytest.approx(sim, abs=0.05)
    assert pm.expected_experts_touched(256, 8, 0) == 0
    assert pm.expected_experts_touched(256, 8, 1) == pytest.approx(8)
    assert pm.expected_experts_touched(256, 8, 10_000) == pytest.approx(256)
    with pytest.raises(ValueError, match="experts_per_tok=9"):
        pm.expected_experts_touched(8, 9, 1)


def test_seed_claims():
    assert pm.B200.mem_bw / pm.H100_SXM.mem_bw > 2  # 8 / 3.35 = 2.39
    assert pm.B200.link_bw / pm.H100_SXM.link_bw == 2
    # FP4 halves FP8 weight memory but for its scales (4.5 vs 8 bits) and the BF16 embeddings
    m = pm.LLAMA3_70B
    quantized = m.block_linear_params(0)
    assert quantized * pm.bytes_per_element("nvfp4") / (quantized * pm.bytes_per_element("fp8")) == 4.5 / 8
    ratio = pm.weight_memory(m, pm.PRECISIONS["nvfp4"]) / pm.weight_memory(m, pm.PRECISIONS["fp8"])
    assert 0.5625 < ratio < 0.6


def test_compute_paths():
    assert pm.H100_SXM.compute_for("nvfp4") == "fp8"  # Hopper has no FP4 tensor cores
    assert pm.B200.compute_for("nvfp4") == "fp4"
    assert pm.B200.compute_for("bf16") == "bf16"
    with pytest.raises(ValueError, match="no 'fp4'"):
        pm.H100_SXM.peak_flops("fp4")
    with pytest.raises(ValueError, match="'int3'"):
        pm.Precision(weights="int3")
    with pytest.raises(ValueError, match="batch=0"):
        pm.decode_step(pm.LLAMA3_70B, pm.H100_SXM, pm.PRECISIONS["bf16"], 0, 10)


def test_all_reduce_only_with_tp_and_slower_across_nodes():
    m, hw, prec = pm.LLAMA3_70B, pm.H100_SXM, pm.PRECISIONS["bf16"]
    assert pm.decode_step(m, hw, prec, 8, 0, tp=1).comm_s == 0
    within = pm.decode_step(m, hw, prec, 8, 0, tp=8).comm_s
    # 2 all-reduces x 80 layers of 8 x 8192 bf16, ring factor 2 * 7/8, 450 GB/s each way
    assert within == pytest.approx(2 * 80 * 2 * 7 / 8 * 8 * 8192 * 2 / 450e9)
    assert pm.decode_step(m, hw, prec, 8, 0, tp=16).comm_s > within


@pytest.mark.parametrize("preset", ["small-llama", "tiny-qwen3", "qwen2-0.5b"])
def test_from_config_counts_jaxserve_params(preset):
    import jax

    from jaxserve.models import get_preset, init_params
    config = get_preset(preset)
    shapes = jax.eval_shape(lambda k: init_params(config, k), jax.random.key(0))
    actual = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(shapes))
    assert pm.ModelProfile.from_config(config).total_params() == actual


def test_from_config_counts_jaxserve_moe_params():
    import jax

    from jaxserve.config import ModelConfig
    from jaxserve.models import init_params
    config = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=3, num_heads=4,
                         num_kv_heads=2, head_dim=8, num_experts=4, num_experts_per_tok=2,
                         moe_intermediate_size=16, num_shared_experts=1, first_k_dense=1, router="deepseek_v3")
    shapes = jax.eval_shape(lambda k: init_params(config, k), jax.random.key(0))
    actual = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(shapes))
    profile = pm.ModelProfile.from_config(config)
    assert profile.total_params() == actual
    assert profile.num_moe_layers == 2


def test_from_config_refuses_what_it_does_not_model():
    from jaxserve.config import ModelConfig
    with pytest.raises(ValueError, match="o_bias=True"):
        pm.ModelProfile.from_config(ModelConfig(o_bias=True))
