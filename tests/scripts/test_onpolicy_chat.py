"""scripts/onpolicy_chat.py's two generators give the same greedy continuations (float32 weights): the serving
engine (the default, far faster at a batch) and the ``target_only_generate`` loop the bundled draft's data came from."""
import importlib.util
import pathlib
import sys

import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]


def _script():
    spec = importlib.util.spec_from_file_location("onpolicy_chat", REPO / "scripts" / "onpolicy_chat.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (its dataclass resolves string annotations through sys.modules)
    spec.loader.exec_module(module)
    return module


def test_engine_and_loop_generators_agree_greedy():
    from jaxserve.models.loading import resolve_model
    chat = _script()
    cfg = chat.ChatDataConfig(target="jaxserve/tiny-code", max_tokens=6, batch_size=3, dtype="float32")
    config, params, tokenizer = resolve_model(cfg.target)
    batch = [("plain", tokenizer.encode(text, add_special_tokens=False))
             for text in ("def add(a, b):\n", "import numpy as np\n", "for i in range(10):\n")]
    temps, seeds = np.zeros(3, np.float32), np.arange(3)
    engine = chat.engine_generator(cfg)(batch, temps, seeds, tokenizer.eos_token_id)
    loop = chat.loop_generator(config, params, cfg)(batch, temps, seeds, tokenizer.eos_token_id)
    assert engine == loop and all(0 < len(g) <= 6 for g in engine), (engine, loop)


def test_edits_mix_prompts_fit_and_end_with_the_assistant_turn():
    """mix=edits clips each snippet, never the chat markup: every chat prompt still opens the assistant's turn."""
    from jaxserve.tokenizer import load_tokenizer
    from jaxserve.train.loss_focus import assistant_marker
    from jaxserve.zoo import zoo_path
    chat = _script()
    tok = load_tokenizer(zoo_path("smollm2-135m-instruct-draft"))
    cfg = chat.ChatDataConfig(mix="edits", max_prompt_tokens=120, plain_fraction=0.1)
    prompts = chat.build_prompts(tok, cfg)
    marker = assistant_marker(tok)
    chats = [p for kind, p in prompts if kind == "chat"]
    assert len(chats) > 2000 and all(len(p) <= 120 for _, p in prompts)
    assert all(p[-len(marker):] == marker for p in chats)
    edit = chat.text_edit_prompt(tok, cfg, 1, "A long answer. " * 200)
    assert len(edit) <= 120 and edit[-len(marker):] == marker


def test_sampled_rows_spread_the_fraction():
    rows = _script()._sampled_rows
    assert rows(0.5)(6).tolist() == [False, True] * 3  # v1's alternation
    assert rows(0.25)(8).sum() == 2 and rows(0.0)(5).sum() == 0 and rows(1.0)(3).all()
    with pytest.raises(ValueError, match="sampled_fraction"):
        rows(1.5)
