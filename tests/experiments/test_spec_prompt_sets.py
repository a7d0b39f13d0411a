"""The spec_decoding experiment's chat prompt sets (SmolLM2's tokenizer and template) and its engine policy names."""
import numpy as np
import pytest

from experiments.spec_decoding.measure import engine_policy
from experiments.spec_decoding.prompt_sets import CODE_EDITS, OPEN_QUESTIONS, TEXT_EDITS, chat_prompts
from experiments.spec_decoding.run import check, make_prompts
from experiments.spec_decoding.config import CONFIG
from jaxserve.tokenizer import load_tokenizer
from jaxserve.zoo import zoo_path


@pytest.fixture(scope="module")
def tokenizer():
    """SmolLM2's tokenizer and chat template, as bundled with its zoo draft (no GGUF needed)."""
    return load_tokenizer(zoo_path("smollm2-135m-instruct-draft"))


def test_repetitive_set_alternates_code_and_text_edits_that_fit_and_end_with_the_assistant_turn(tokenizer):
    prompts = chat_prompts(tokenizer, "chat_repetitive", 6, 160, seed=0)
    header = tokenizer.encode("<|im_start|>assistant\n", add_special_tokens=False)
    assert len(prompts) == 6 and all(len(p) <= 160 and p[-len(header):] == header for p in prompts)
    texts = [tokenizer.decode(p) for p in prompts]
    assert all(any(e in t for e in CODE_EDITS) and "```python" in t for t in texts[0::2])
    assert all(any(e in t for e in TEXT_EDITS) for t in texts[1::2])
    assert len(set(texts)) == 6 and min(map(len, prompts)) > 100  # distinct sources, filled to near the cap
    assert chat_prompts(tokenizer, "chat_repetitive", 6, 160, seed=0) == prompts  # seeded
    with pytest.raises(ValueError, match="unknown chat prompt set 'chat'"):
        chat_prompts(tokenizer, "chat", 2, 160, seed=0)


def test_free_set_is_open_questions_and_make_prompts_pads_to_prompt_len(tokenizer):
    texts = [tokenizer.decode(p) for p in chat_prompts(tokenizer, "chat_free", 20, 160, seed=1)]
    asked = [q for t in texts for q in OPEN_QUESTIONS if q in t]
    assert len(asked) == 20 and len(set(asked)) == len(OPEN_QUESTIONS)  # every question before any repeats
    cfg = CONFIG.__class__(**{**CONFIG.__dict__, "prompt_set": "chat_free", "prompt_len": 64, "min_prompts": 5})
    prompts, lens = make_prompts(cfg, tokenizer, 49152, batch=2)
    assert prompts.shape == (3, 2, 64) and lens.shape == (3, 2) and (lens < 64).all()
    assert all((prompts[s, b, lens[s, b]:] == 0).all() for s in range(3) for b in range(2))
    assert np.count_nonzero(prompts[0, 0]) == lens[0, 0]


def test_policy_names_and_config_checks():
    assert engine_policy("none") == {} and engine_policy("adaptive") == {"adaptive": True}
    assert engine_policy("by_batch:8") == {"disable_by_batch_size": 8}
    with pytest.raises(ValueError, match="'by_batch:x'"):
        engine_policy("by_batch:x")
    with pytest.raises(ValueError, match="prompt_set must be 'code' or one of"):
        check(CONFIG.__class__(prompt_set="chat"))
    with pytest.raises(ValueError, match="needs a target with a chat template"):
        check(CONFIG.__class__(prompt_set="chat_free", target="preset:tiny-llama"))
