"""The engine on a mesh of 8 simulated CPU devices gives the one-device outputs, for every layout.

Run by test_mesh.py in a subprocess (XLA_FLAGS must be set before jax is imported), one per model family, so
pytest-xdist spreads them; each process runs every check of its family (compiling is what costs: engines of the
same model and layout share their compiled programs, and the collectives' HLO comes from the persistent
compilation cache) and prints one line per check, "OK" last.
Usage: python tests/parallel/mesh_check.py llama|qwen3_moe|mixtral
"""
import os
import pathlib
import sys
import tempfile
from unittest import mock

from tests.xla_flags import with_devices

os.environ["XLA_FLAGS"] = with_devices(8)

import jax  # noqa: E402
import numpy as np  # noqa: E402

from jaxserve import LLM, SamplingParams  # noqa: E402
from jaxserve.models.hf_export import save_hf  # noqa: E402
import jaxserve.parallel.layout as layout_module  # noqa: E402
from jaxserve.parallel.hlo import Collective, collectives, gathers_of  # noqa: E402
from tests.parallel.ragged_a2a import check_docstring_example, emulated  # noqa: E402
from tests.parallel.tiny import (ENGINE, GREEDY, MODELS, PROMPTS, SEEDED, make, make_spec, params_of,  # noqa: E402
                                 tokens)

# every program into the persistent cache: reading a step's collectives (an AOT compile of a program the engine
# already ran) is then a cache hit, not a second compile
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)

GRID = [(1, False, 1), (2, False, 1), (4, False, 1), (2, True, 1), (1, True, 4), (2, True, 2)]  # (T, EP, D)


def check_grid(name: str) -> tuple[dict, tuple]:
    """Greedy and seeded outputs of ``name`` equal for every layout of the grid (the expert-parallel ones for an
    MoE model only); returns the engines by (t, ep, d) and the one-device (greedy, seeded) outputs."""
    llms, ref = {}, None
    for t, ep, d in GRID:
        if ep and not MODELS[name].num_experts:
            continue
        got = (tokens(llm := make(name, t, ep, d), GREEDY), tokens(llm, SEEDED))
        llms[t, ep, d] = llm
        ref = got if ref is None else ref
        assert got == ref, (name, t, ep, d, got, ref)
        print(f"{name} T={t} EP={ep} D={d}: greedy and seeded outputs equal", flush=True)
    return llms, ref


def spec(x) -> tuple:
    """x's PartitionSpec as a tuple without trailing Nones (how a step's outputs report it)."""
    axes = list(x.sharding.spec)
    while axes and axes[-1] is None:
        axes.pop()
    return tuple(axes)


def check_shardings(llm):
    """Pool by KV head; Megatron params; KV heads replicated when T > K (``llm``: the Llama at T=4, after steps:
    the donated pool comes back as sharded)."""
    r = llm.engine.runner  # K=2 < T=4: each KV head twice, one per shard
    layer = r.pool.layers[0]
    assert r.config.num_kv_heads == 4 and layer.v.shape[2] == 4, r.config
    assert spec(layer.k) == (None, "tensor") and spec(layer.v) == (None, None, "tensor")
    assert {s.data.shape[2] for s in layer.v.addressable_shards} == {1}
    attn, mlp = r.params["layers_0"]["attn"], r.params["layers_0"]["mlp"]
    assert spec(attn["q_proj"]["kernel"]) == (None, "tensor")
    assert spec(attn["o_proj"]["kernel"]) == ("tensor",)
    assert spec(mlp["up_proj"]["kernel"]) == (None, "tensor")
    assert spec(mlp["down_proj"]["kernel"]) == ("tensor",)
    assert spec(r.params["embed"]["embedding"]) == ()
    print("shardings: pool by KV head, params by the rule table", flush=True)


def check_expert_shardings(llm):
    """Experts over all devices, router and pool as without EP (``llm``: Qwen3-MoE at T=2, EP, D=2)."""
    r = llm.engine.runner
    bank = r.params["layers_1"]["mlp"]["gate_proj"]
    assert spec(bank) == (("data", "tensor"),) and bank.addressable_shards[0].data.shape[0] == 2
    assert spec(r.params["layers_1"]["mlp"]["router"]) == ()
    assert spec(r.pool.layers[1].v) == (None, None, "tensor")
    print("shardings: experts over data x tensor", flush=True)


def decode_collectives(llm):
    r = llm.engine.runner
    shape = r.buckets.decode_shapes()[-1]
    text = r.compiled_text(shape)
    return shape[0], text, collectives(text)


def check_hlo(llms):
    """TP: one all-reduce of [B, E] after o_proj and after down_proj per layer, no gather; no gather of the
    pool. Prints each layout's collectives (``llms``: the Llama's engines by (t, ep, d))."""
    c = MODELS["llama"]
    for t in (2, 4):
        llm = llms[t, False, 1]
        b, text, coll = decode_collectives(llm)
        assert set(coll) == {"all-reduce"}, coll
        assert coll["all-reduce"].count == 2 * c.num_layers, coll
        assert coll["all-reduce"].bytes == 2 * c.num_layers * b * c.hidden_size * 4, coll
        layer = llm.engine.runner.pool.layers[0]
        assert not gathers_of(text, layer.k.shape) and not gathers_of(text, layer.v.shape)
        print(f"hlo llama T={t} decode B={b}: {coll}", flush=True)


def check_expert_hlo(llms):
    """EP: three all_to_all per MoE layer (rows, ids, results back), the o_proj all-reduce under TP, and gathers
    of the layer's output and router probabilities only; no gather of the pool (``llms``: Qwen3-MoE's engines)."""
    for t, d in ((2, 2), (1, 4), (2, 1)):
        llm = llms[t, True, d]
        b, text, coll = decode_collectives(llm)
        layers = MODELS["qwen3_moe"].num_layers
        assert coll["all-to-all"].count == 3 * layers, coll
        assert coll.get("all-reduce", Collective(0, 0)).count == (layers if t > 1 else 0), coll  # o_proj only
        assert coll["all-gather"].count == 2 * layers, coll  # the combined output, and the router's probabilities
        layer = llm.engine.runner.pool.layers[0]
        assert not gathers_of(text, layer.k.shape) and not gathers_of(text, layer.v.shape)
        print(f"hlo qwen3_moe T={t} EP D={d} decode B={b}: {coll}", flush=True)


def check_moe_tensor_parallel(name: str, llms: dict):
    """MoE under TP without EP (``llms``: ``name``'s engines by (t, ep, d)): each expert split on its intermediate
    dim (gate/up column-, down row-parallel); one all-reduce of [B, E] per layer after o_proj and one after the
    experts, no other collective (no expert weight gathered), at T=2 and T=4."""
    c = MODELS[name]
    mlp = llms[4, False, 1].engine.runner.params["layers_1"]["mlp"]
    assert spec(mlp["gate_proj"]) == spec(mlp["up_proj"]) == (None, None, "tensor") and spec(mlp["router"]) == ()
    assert spec(mlp["down_proj"]) == (None, "tensor"), spec(mlp["down_proj"])
    i = c.expert_intermediate_size
    assert {s.data.shape for s in mlp["down_proj"].addressable_shards} == {(c.num_experts, i // 4, c.hidden_size)}
    for t in (2, 4):
        b, text, coll = decode_collectives(llms[t, False, 1])
        assert set(coll) == {"all-reduce"}, coll
        assert coll["all-reduce"].count == 2 * c.num_layers, coll
        assert coll["all-reduce"].bytes == 2 * c.num_layers * b * c.hidden_size * 4, coll
        print(f"hlo {name} T={t} experts split on I, decode B={b}: {coll}", flush=True)


def check_quantized(cases, float_llms):
    """Quantized once on the host, then split: T=2 gives the one-device quantized model's tokens (greedy and
    seeded) and log-probs within float rounding (the row-parallel sums add in another order); codes and block
    scales split as their float kernel, tensor scales whole; the decode step's collectives those of the float
    model at T=2 (``float_llms``: engines by name): the matmul runs per shard, no weight is gathered, whichever
    kernel (``quant_impl="pallas"``: the Pallas kernel, interpreted); a K split inside a scale block is an error
    naming the layer. ``cases``: (model, format, quant_impl) triples."""
    logged = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, logprobs=True)
    for name, fmt, impl in cases:
        one, two = (make(name, t=t, quantization=fmt, quant_impl=impl) for t in (1, 2))
        want, got = one.generate(PROMPTS, logged, use_tqdm=False), two.generate(PROMPTS, logged, use_tqdm=False)
        assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in want], fmt
        err = max(abs(a - b) for g, w in zip(got, want) for a, b in zip(g.outputs[0].logprobs, w.outputs[0].logprobs))
        assert err < 1e-4 and tokens(two, SEEDED) == tokens(one, SEEDED), (fmt, err)
        r = two.engine.runner
        o, q = r.params["layers_0"]["attn"]["o_proj"]["kernel"], r.params["layers_0"]["attn"]["q_proj"]["kernel"]
        assert spec(o.data) == ("tensor",) and spec(q.data) == (None, "tensor") and spec(o.tensor_scale) == ()
        assert spec(o.scales) == (() if fmt == "fp8" else ("tensor",)) and o.data.addressable_shards[0].data.shape[0] == o.data.shape[0] // 2
        b, text, coll = decode_collectives(two)
        c = MODELS[name]
        assert set(coll) == {"all-reduce"} and coll["all-reduce"].bytes == 2 * c.num_layers * b * c.hidden_size * 4, coll
        assert coll == decode_collectives(float_llms[name])[2], coll
        print(f"{fmt} ({impl}) {name} T=2: tokens equal, log-probs within {err:.1e}; as in float: {coll}", flush=True)
    try:
        make("llama", t=2, quantization="mxfp4")
        raise AssertionError("an MXFP4 o_proj split inside its block was accepted")
    except ValueError as e:
        assert str(e).startswith("quantization='mxfp4' with tensor_parallel_size=2: layers_0/attn/o_proj/kernel: its "
                                 "mxfp4 kernel splits K=32 over mesh axis 'tensor' of size 2 (16 per device)"), e
    print("quantized: an MXFP4 split inside a block is refused by name", flush=True)


def check_w4a4_matmul():
    """NVFP4 W4A4 emulation per shard at T=2 equals one device: column-parallel (x whole on every shard) and
    row-parallel (x quantized over its whole amax, though each shard holds half of it), reference and Pallas."""
    import jax.numpy as jnp
    from jaxserve.parallel.layout import make_layout
    from jaxserve.quant import MatmulSettings, quantized_matmul
    from jaxserve.quant.sharded import sharded_quantized_matmul
    from pallas_kernels.fp4 import quantize
    kx, kw = jax.random.split(jax.random.key(7))
    x = jax.random.normal(kx, (5, 64)) * jnp.where(jnp.arange(64) < 32, 1.0, 8.0)  # each half its own amax
    w = quantize(jax.random.normal(kw, (64, 48)), "nvfp4", axis=0)
    layout = make_layout(MODELS["llama"], 2)
    for impl in ("reference", "pallas"):
        settings = MatmulSettings(impl, w4a4=True)
        want = np.asarray(quantized_matmul(x, w, settings))
        for layer in ("o_proj", "q_proj"):
            run = jax.jit(lambda x, w: sharded_quantized_matmul(quantized_matmul, x, w, settings, layout,
                                                                f"layers_0/attn/{layer}/kernel"))
            got = np.asarray(run(x, w))
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4 * np.abs(want).max(), err_msg=f"{impl} {layer}")
    print("nvfp4 W4A4 matmul per shard (row- and column-parallel, reference and Pallas) equals one device", flush=True)


def check_speculative(methods, plain):
    """Speculative decoding with the target split over T=2 (the proposer and a draft's pool replicated): greedy
    outputs equal the plain one-device ones (``plain``), seeded ones the one-device speculative engine's after the
    same requests (the suffix proposer drafts from earlier outputs too, and other drafts draw other samples)."""
    for method in methods:
        two, one = make_spec(method, t=2), make_spec(method)
        assert tokens(two, GREEDY) == plain == tokens(one, GREEDY), method
        assert tokens(two, SEEDED) == tokens(one, SEEDED), method
        r = two.engine.runner
        assert spec(r.pool.layers[0].v) == (None, None, "tensor"), method
        assert r.draft_pool is None or spec(r.draft_pool.layers[0].k) == (), method
        print(f"speculative {method} T=2: greedy outputs equal, seeded too", flush=True)


def check_preemption_and_prefix_cache():
    """Under TP a pool too small preempts, a shared prefix hits the cache, and n=2 samples fork their blocks
    (copy-on-write on the sharded pool); outputs stay the same.

    Every engine here has the grid's configuration (its pool too: a pool of another size is another program), so
    the decode (B=4) and mixed programs are the grid's; new are only the decode of a lone sequence (B=1) on one
    device and at T=2, and the block copy."""
    rng = np.random.default_rng(0)
    vocab = MODELS["llama"].vocab_size
    # 4 x (8 + 60) tokens need 68 of the pool's 64 blocks: one sequence is preempted, and recomputed alone; the
    # prompts prefill in one step (32 tokens), so the others decode together to the end (B=4, the grid's program)
    long_prompts = [rng.integers(0, vocab, 8).tolist() for _ in range(4)]
    long = SamplingParams(max_tokens=60, temperature=0.0, ignore_eos=True)
    one = make("llama")  # three at a time (51 blocks) and then one: never preempted
    ref = tokens(one, long, long_prompts[:3]) + tokens(one, long, long_prompts[3:])
    assert one.stats()["num_preemptions"] == 0, one.stats()
    small = make("llama", t=2)
    assert tokens(small, long, long_prompts) == ref and small.stats()["num_preemptions"] > 0, small.stats()
    shared = [[3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5] + p for p in ([8], [9, 7])]
    plain = make("llama", enable_prefix_caching=False)
    want = tokens(plain, GREEDY, shared[:1]) + tokens(plain, GREEDY, shared[1:])
    cached = make("llama", t=2)  # a fresh engine (its cache empty), the grid's compiled programs
    assert tokens(cached, GREEDY, shared[:1]) + tokens(cached, GREEDY, shared[1:]) == want
    assert cached.stats()["prefix_cache_hit_rate"] > 0, cached.stats()
    forked = SamplingParams(max_tokens=6, temperature=1.0, seed=5, n=2, ignore_eos=True)  # copy-on-write copies
    assert tokens(cached, forked, PROMPTS[:2]) == tokens(make("llama"), forked, PROMPTS[:2])  # 4 sequences: B=4
    print(f"TP: preemption ({small.stats()['num_preemptions']}), prefix caching (hit rate "
          f"{cached.stats()['prefix_cache_hit_rate']:.2f}) and forked samples give the one-device outputs", flush=True)


def check_attention_impls(want, impls=("pallas",)):
    """The Pallas kernels (interpret mode), or the reference attention, per shard at T=2: the grid's prompts, its
    one-device greedy outputs' first 3 tokens (``want``)."""
    sp = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
    for impl in impls:
        assert tokens(make("llama", t=2, attention_impl=impl), sp) == [[t[:3] for t in o] for o in want], impl
        print(f"attention_impl={impl} T=2: outputs equal", flush=True)


def check_quantized_moe(name: str):
    """NVFP4 attention beside float experts, the experts split on I (T=2) or over devices (EP, D=2): greedy
    outputs equal the one-device quantized model's."""
    want = tokens(make(name, quantization="nvfp4"), GREEDY)
    for t, ep, d in ((2, False, 1), (2, True, 2)):
        assert tokens(make(name, t, ep, d, quantization="nvfp4"), GREEDY) == want, (name, t, ep, d)
        print(f"nvfp4 {name} T={t} EP={ep} D={d}: greedy outputs equal", flush=True)


def check_moe_dispatch(auto_llm, greedy):
    """moe_dispatch: "auto" on CPU is the padded all_to_all (``auto_llm``: Qwen3-MoE at T=2, EP, D=2, which the grid
    ran); "ragged" (allowed here as on a GPU) makes the engine's decode step lower to ragged_all_to_all, 3 per MoE
    layer and no padded all_to_all left, and, ragged_all_to_all emulated (XLA:CPU has none), serves the one-device
    greedy outputs (``greedy``) at T=2, EP, D=1: its offsets put every row back where the padded dispatch does."""
    layers = MODELS["qwen3_moe"].num_layers
    r = auto_llm.engine.runner
    auto = r.lowered(r.buckets.decode_shapes()[-1]).as_text()
    assert r.layout.moe_dispatch == "all_to_all" and "ragged_all_to_all" not in auto, r.layout
    assert auto.count('"stablehlo.all_to_all"') == 3 * layers, auto.count('"stablehlo.all_to_all"')
    with mock.patch.object(layout_module, "RAGGED_PLATFORMS", ("cpu",)):
        ragged = make("qwen3_moe", 2, True, 2, moe_dispatch="ragged").engine.runner
        text = ragged.lowered(ragged.buckets.decode_shapes()[-1]).as_text()
        counts = text.count("@ragged_all_to_all("), text.count('"stablehlo.all_to_all"')
        assert ragged.layout.moe_dispatch == "ragged" and counts == (3 * layers, 0), (ragged.layout, counts)
        print("moe_dispatch: auto on CPU lowers to all_to_all, ragged to ragged_all_to_all", flush=True)
        check_docstring_example(jax.devices())
        with emulated():  # another layout (D=1) than the lowered one: its programs traced with the emulation
            assert tokens(make("qwen3_moe", 2, True, 1, moe_dispatch="ragged"), GREEDY) == greedy
    print("moe_dispatch=ragged T=2 EP (ragged_all_to_all emulated): greedy outputs equal", flush=True)


def check_speculative_expert_parallel(greedy):
    """N-gram speculation on Qwen3-MoE with its experts split (T=2, EP): the verify rounds run the MoE layers over
    B x (1 + gamma) tokens through the all_to_all; greedy outputs equal one device's plain ones (``greedy``)."""
    llm = make_spec("ngram", 2, "qwen3_moe", ep=True)
    assert tokens(llm, GREEDY) == greedy
    assert int(llm.engine.spec_stats.metrics.rounds.sum()) > 0, llm.engine.spec_stats.metrics
    print("speculative ngram T=2 EP: greedy outputs equal", flush=True)


def check_hf_directory(name: str, want, t: int, ep: bool = False, d: int = 1):
    """Tiny ``name`` written as a Hugging Face directory (hf_export: config.json + safetensors, an MoE model's
    experts one tensor each) and loaded by path at (t, ep, d) gives the in-memory params' greedy outputs (``want``);
    its config is the in-memory one, so the engine runs the grid's compiled programs."""
    with tempfile.TemporaryDirectory() as tmp:
        path = save_hf(pathlib.Path(tmp) / name, MODELS[name], jax.device_get(params_of(name)))
        llm = LLM(str(path), tensor_parallel_size=t, enable_expert_parallel=ep, data_parallel_size=d, **ENGINE)
        assert llm.engine.config == MODELS[name], llm.engine.config
        assert tokens(llm, GREEDY) == want
    print(f"{name} from an HF directory T={t} EP={ep} D={d}: greedy outputs equal", flush=True)


def check_multi_step(greedy):
    """Four decode steps a program (``num_scheduler_steps``) at T=2 (the pool sharded, each step's draws replicated
    and fed to the next on the mesh): one device's single-step greedy (``greedy``) and seeded outputs."""
    llm = make("llama", t=2, num_scheduler_steps=4)
    assert tokens(llm, GREEDY) == greedy
    assert tokens(llm, SEEDED) == tokens(make("llama"), SEEDED)
    print("multi-step decoding T=2: outputs equal", flush=True)


def check_llama():
    llms, (greedy, _) = check_grid("llama")
    check_hf_directory("llama", greedy, t=4)  # KV heads repeated
    check_shardings(llms[4, False, 1])
    check_hlo(llms)
    check_preemption_and_prefix_cache()
    check_attention_impls(greedy)  # Pallas per shard; the reference attention per shard: llama_weights_spec


def check_llama_weights_and_speculation():
    """Llama's second half, a process of its own (xdist runs it beside the first): quantized weights per shard
    and every speculative method at T=2; the reference attention per shard."""
    plain = tokens(make("llama"), GREEDY)
    check_attention_impls(plain, ("reference",))
    check_w4a4_matmul()
    check_quantized([("llama", "nvfp4", "pallas"), ("llama", "fp8", "auto"), ("llama_d16", "mxfp4", "auto")],
                    {"llama": make("llama", t=2), "llama_d16": make("llama_d16", t=2)})
    check_speculative(["draft_model", "ngram", "suffix", "medusa"], plain)
    check_multi_step(plain)


def check_qwen3_moe():
    llms, (greedy, _) = check_grid("qwen3_moe")
    check_hf_directory("qwen3_moe", greedy, t=2, ep=True, d=2)
    check_expert_shardings(llms[2, True, 2])
    check_expert_hlo(llms)
    check_moe_tensor_parallel("qwen3_moe", llms)
    check_speculative_expert_parallel(greedy)
    check_moe_dispatch(llms[2, True, 2], greedy)  # last: its engines trace with a patched ragged_all_to_all


def check_mixtral():
    llms, (greedy, _) = check_grid("mixtral")
    check_hf_directory("mixtral", greedy, t=1, ep=True, d=4)
    check_moe_tensor_parallel("mixtral", llms)


def check_moe_quantized():
    """Both MoE families' NVFP4 attention beside float experts, a process of its own (slow-marked)."""
    check_quantized_moe("qwen3_moe")
    check_quantized_moe("mixtral")


PARTS = {"llama": check_llama, "llama_weights_spec": check_llama_weights_and_speculation, "qwen3_moe": check_qwen3_moe,
         "mixtral": check_mixtral, "moe_quantized": check_moe_quantized}


def main(part: str):
    PARTS[part]()
    print("OK")


if __name__ == "__main__":
    main(sys.argv[1])
