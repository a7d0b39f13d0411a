"""scripts/onpolicy_chat.py's two generators give the same greedy continuations (float32 weights): the serving
engine (the default, far faster at a batch) and the ``target_only_generate`` loop the bundled draft's data came from."""
import importlib.util
import pathlib
import sys

import numpy as np

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
