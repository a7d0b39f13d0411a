"""Serving on a device mesh: the checks on 8 simulated devices run in a subprocess (mesh_check.py), so this
pytest process keeps its one CPU device; the layout's errors need no mesh and run here."""
import os
import pathlib
import subprocess
import sys

import jax
import pytest
from jax.sharding import AbstractMesh, PartitionSpec as P

from jaxserve import LLM
from jaxserve.cli import main as cli_main
from jaxserve.config import EngineConfig, ModelConfig
from jaxserve.models import init_params
from jaxserve.parallel.distributed import free_port
from jaxserve.parallel.hlo import collectives
from jaxserve.parallel.layout import resolve_moe_dispatch
from jaxserve.parallel.sharding import param_specs
from jaxserve.quant import quantized_shapes

HERE = pathlib.Path(__file__).parent
ROOT = HERE.parent.parent
ENV = {**{k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}, "PYTHONPATH": str(ROOT)}
CONFIG = ModelConfig(vocab_size=61, hidden_size=32, intermediate_size=48, num_layers=1, num_heads=4,
                     num_kv_heads=2, head_dim=8, max_position_embeddings=64)


def run_check(*args, timeout=1200):  # generous: CI's 2 cores also run the other worker
    proc = subprocess.run([sys.executable, HERE / "mesh_check.py", *args], cwd=ROOT, env=ENV, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)
    assert proc.returncode == 0 and proc.stdout.rstrip().endswith("OK"), proc.stdout[-4000:]


# Slow-marked, beyond the grid: llama_weights_spec (quantized weights and every speculative method at T=2; with an
# empty compilation cache ~450 s of a CI worker under load, the most of any test) and moe_quantized (NVFP4 attention
# beside float experts under TP and EP, three more engines per MoE family: 46 s beside the families' 132 s)
@pytest.mark.parametrize("family", ["llama", pytest.param("llama_weights_spec", marks=pytest.mark.slow), "qwen3_moe",
                                    "mixtral", pytest.param("moe_quantized", marks=pytest.mark.slow)])
def test_mesh_layouts_on_8_devices(family):
    """Each family over (T, EP, D) in (1,off,1) (2,off,1) (4,off,1) (2,on,1) (1,on,4) (2,on,2) (EP for the MoE
    models) equals one device, greedy and seeded; shardings and the decode step's HLO collectives per layout.
    Each family also loaded by path from a Hugging Face directory (hf_export) at one layout: Llama at T=4, Qwen3-MoE
    at T=2, EP, D=2, Mixtral at EP, D=4.
    Llama: preemption, prefix caching and forked samples under TP (engines of the grid's configuration: its compiled
    programs), Pallas attention per shard; in a process of its own (llama_weights_spec), the reference attention per
    shard, NVFP4 (the Pallas matmul per shard, the float model's collectives), FP8 and MXFP4 weights, and every
    speculative method at T=2.
    The MoE models: experts split on I at T=2 and T=4; in a process of their own (moe_quantized), NVFP4 attention
    beside them at T=2 and EP. Qwen3-MoE: moe_dispatch="auto" lowers to the padded all_to_all on CPU, "ragged" to
    ragged_all_to_all, and serves the same tokens with ragged_all_to_all emulated (tests/parallel/ragged_a2a.py);
    n-gram speculation at T=2 with EP gives one device's greedy tokens."""
    run_check(family)


def test_two_processes_serve_one_model():
    """Two processes on 127.0.0.1 (gloo, one CPU device each): a Qwen3-MoE tensor- and expert-parallel over both
    (T=2, EP) gives the same outputs in both processes, and the one-device engine's.

    The one known race: another program taking the free port before the coordinator binds it (the
    test then fails at start-up, not wrongly)."""
    port = free_port()
    procs = [subprocess.Popen([sys.executable, HERE / "mp_engine_check.py", str(i), "2", str(port)], cwd=ROOT,
                              env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in range(2)]
    try:
        outs = [p.communicate(timeout=600)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out[-3000:]
    assert "process 0: tensor- and expert-parallel over 2 processes equal one device" in outs[0], outs[0][-3000:]
    printed = [[line.split(": ", 1)[1] for line in out.splitlines() if line.startswith(f"process {i} outputs: ")]
               for i, out in enumerate(outs)]
    assert len(printed[0]) == 1 and printed[0] == printed[1], printed


def llm(**kw):
    return LLM.from_params(CONFIG, init_params(CONFIG, jax.random.key(0)), num_kv_blocks=8, **kw)


@pytest.mark.parametrize("kw, match", [
    (dict(tensor_parallel_size=3), "tensor_parallel_size=3 must divide the model's num_heads=4"),
    (dict(tensor_parallel_size=2), r"tensor_parallel_size=2 x data_parallel_size=1 needs 2 devices, only 1 visible"),
    (dict(enable_expert_parallel=True), r"enable_expert_parallel=True needs a Mixture-of-Experts model"),
    (dict(data_parallel_size=2), "data_parallel_size=2 needs enable_expert_parallel=True"),
    (dict(tensor_parallel_size=0), "EngineConfig.tensor_parallel_size must be > 0, got 0"),
    (dict(moe_dispatch="ragged"), r"moe_dispatch='ragged' needs lax.ragged_all_to_all, which XLA on platform 'cpu' "
                                  r"does not implement \(it does on gpu and tpu\); use 'auto' or 'all_to_all'"),
    (dict(moe_dispatch="nccl"), r"EngineConfig.moe_dispatch must be one of \('auto', 'all_to_all', 'ragged'\), "
                                r"got 'nccl'"),
])
def test_layout_errors_name_the_option(kw, match):
    with pytest.raises(ValueError, match=match):
        llm(**kw)


@pytest.mark.parametrize("moe_dispatch, platform, want", [
    ("auto", "cpu", "all_to_all"), ("auto", "gpu", "ragged"), ("auto", "tpu", "ragged"),
    ("all_to_all", "gpu", "all_to_all"), ("ragged", "gpu", "ragged"), ("all_to_all", "cpu", "all_to_all"),
])
def test_moe_dispatch_resolves_per_platform(moe_dispatch, platform, want):
    """"auto" is ragged_all_to_all where XLA has it (GPU, TPU), the padded all_to_all on CPU."""
    assert resolve_moe_dispatch(moe_dispatch, platform) == want


def test_kv_heads_neither_divided_nor_replicated_is_an_error():
    config = CONFIG.replace(num_heads=6, num_kv_heads=3)
    with pytest.raises(ValueError, match=r"tensor_parallel_size=2 must divide the model's num_kv_heads=3 or be a "
                                         r"multiple of it"):
        LLM.from_params(config, init_params(config, jax.random.key(0)), tensor_parallel_size=2)


def test_experts_must_divide_over_the_devices():
    config = CONFIG.replace(num_experts=6, num_experts_per_tok=2)
    with pytest.raises(ValueError, match=r"splits num_experts=6 over tensor_parallel_size x data_parallel_size = 4"):
        LLM.from_params(config, init_params(config, jax.random.key(0)), tensor_parallel_size=2, data_parallel_size=2,
                        enable_expert_parallel=True)


def test_expert_width_must_divide_over_the_tensor_axis():
    config = CONFIG.replace(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=6)
    with pytest.raises(ValueError, match=r"tensor_parallel_size=4 must divide the experts' intermediate size 6"):
        LLM.from_params(config, init_params(config, jax.random.key(0)), tensor_parallel_size=4)


@pytest.mark.parametrize("fmt, t, o_proj, scales", [
    ("nvfp4", 2, P("tensor", None), P("tensor", None)),  # K=32: a block of 16 per device
    ("fp8", 4, P("tensor", None), P(None, None)),  # a per-tensor scale [1, 1]: whole on every device
])
def test_quantized_kernels_split_like_their_float_kernels(fmt, t, o_proj, scales):
    config = CONFIG.replace(intermediate_size=64)  # down_proj K=64: whole NVFP4 blocks at T=2
    specs = param_specs(quantized_shapes(init_params(config, jax.random.key(0)), fmt), AbstractMesh((t,), ("tensor",)))
    attn = specs["layers_0"]["attn"]
    assert (attn["o_proj"]["kernel"].data, attn["o_proj"]["kernel"].scales) == (o_proj, scales)
    assert attn["q_proj"]["kernel"].data == P(None, "tensor") and attn["q_proj"]["kernel"].tensor_scale == P()


def test_a_quantized_kernel_split_inside_a_block_is_an_error():
    params = quantized_shapes(init_params(CONFIG, jax.random.key(0)), "nvfp4")
    with pytest.raises(ValueError, match=r"layers_0/attn/o_proj/kernel: its nvfp4 kernel splits K=32 over mesh axis "
                                         r"'tensor' of size 4 \(8 per device\), which must be a multiple of the "
                                         r"nvfp4 block size 16"):
        param_specs(params, AbstractMesh((4,), ("tensor",)))


def test_types_are_checked():
    with pytest.raises(TypeError, match="EngineConfig.enable_expert_parallel"):
        EngineConfig(enable_expert_parallel=1)
    with pytest.raises(TypeError, match="EngineConfig.tensor_parallel_size"):
        EngineConfig(tensor_parallel_size=2.0)
    with pytest.raises(TypeError, match="EngineConfig.moe_dispatch must be a str, got 1"):
        EngineConfig(moe_dispatch=1)


def test_cli_flags_reach_the_engine(capsys):
    rc = cli_main(["generate", "--model", "jaxserve/tiny-code", "--prompt", "x", "--tensor-parallel-size", "3"])
    assert rc == 2 and "tensor_parallel_size=3 must divide the model's num_heads" in capsys.readouterr().err


def test_collectives_parse_sync_and_async_ops():
    text = """
  %all-reduce.1 = f32[4,32]{1,0} all-reduce(f32[4,32]{1,0} %x), channel_id=1
  %ag = (f32[2,8]{1,0}, f32[4,8]{1,0}) all-gather-start(f32[2,8]{1,0} %y), dimensions={0}
  %ag.done = f32[4,8]{1,0} all-gather-done(%ag)
  %a2a = (s32[1,2]{1,0}, s32[1,2]{1,0}) all-to-all(s32[1,2] %a, s32[1,2] %b)
  %add = f32[4,32]{1,0} add(%all-reduce.1, %all-reduce.1)
"""
    got = collectives(text)
    assert {k: (v.count, v.bytes) for k, v in got.items()} == {
        "all-reduce": (1, 4 * 32 * 4), "all-gather": (1, 4 * 8 * 4), "all-to-all": (1, 2 * 2 * 4)}
