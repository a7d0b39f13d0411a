"""One OpenAI-compatible server per test worker while it runs this package's tests: tiny-code behind
uvicorn on 127.0.0.1 and an ephemeral port, with a chat template and an API key, and the ``LLM.generate`` / ``LLM.chat`` references its answers
must match (computed on the same engine before the server takes it over)."""
import dataclasses
import socket
import threading
import time

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("openai")
pytest.importorskip("httpx")

API_KEY = "test-key"
MODEL = "tiny-code"
# A small engine: few shape buckets to compile, and 8 seats, so 64 clients queue and are batched.
ENGINE = dict(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=128, num_kv_blocks=96)
PROMPTS = ["def fibonacci(n):", "import numpy as np\n", "class Stack:", "for i in range(10):"]
MAX_TOKENS = 8
# tiny-code has no chat template of its own; this one is rendered by the same path a real model's is
CHAT_TEMPLATE = ("{% for m in messages %}# {{ m.role }}: {{ m.content }}{{ eos_token }}\n{% endfor %}"
                 "{% if add_generation_prompt %}# assistant:{% endif %}")
CONVERSATION = [{"role": "user", "content": "def add(a, b):"}]
SAMPLED = dict(n=2, seed=7, temperature=0.8, top_k=20, top_p=0.9)
TOP = 3  # top alternatives asked for with log-probs


@dataclasses.dataclass
class Served:
    url: str
    llm: object
    loop: object  # the app's EngineLoop
    greedy: dict  # prompt -> RequestOutput of LLM.generate (greedy, MAX_TOKENS)
    sampled: object  # RequestOutput of PROMPTS[0] with SAMPLED
    logprobs: object  # RequestOutput of PROMPTS[1], greedy, logprobs=True, top_logprobs=TOP
    chat: object  # RequestOutput of LLM.chat(CONVERSATION), greedy
    chat_logprobs: object  # the same with logprobs=True, top_logprobs=TOP

    @property
    def v1(self) -> str:
        return self.url + "/v1"

    def wait_idle(self, timeout: float = 20.0, until=lambda stats: True) -> dict:
        """The loop's stats once no request is live, every KV block is free again and ``until(stats)`` holds
        (a request whose client has gone may not have reached the engine yet: idle alone would pass too early)."""
        deadline = time.monotonic() + timeout
        while True:
            stats = self.loop.stats()
            if (stats["num_live"] == 0 and stats["kv_blocks_free"] == stats["kv_blocks_total"] and until(stats)) \
                    or time.monotonic() > deadline:
                return stats
            time.sleep(0.02)


def _llm():
    import tokenizers
    from jaxserve import LLM
    from jaxserve.models.loading import resolve_model
    from jaxserve.tokenizer import Tokenizer
    from jaxserve.zoo import ZOO_DIR
    config, params, _ = resolve_model(f"jaxserve/{MODEL}")
    hf = tokenizers.Tokenizer.from_file(str(ZOO_DIR / MODEL / "tokenizer.json"))
    return LLM.from_params(config, params, Tokenizer(hf, chat_template=CHAT_TEMPLATE), **ENGINE)


# Package scope (tests/server has an __init__.py for it): the server, its engine thread and its engine are
# shut down once the worker's last test here ends, not kept alive beside every later test of the session.
@pytest.fixture(scope="package")
def served():
    import uvicorn
    from jaxserve import SamplingParams
    from jaxserve.server import build_app
    llm = _llm()
    llm.warmup()
    greedy = SamplingParams(max_tokens=MAX_TOKENS, temperature=0)
    refs = dict(zip(PROMPTS, llm.generate(PROMPTS, greedy, use_tqdm=False)))
    sampled = llm.generate(PROMPTS[0], SamplingParams(max_tokens=MAX_TOKENS, **SAMPLED), use_tqdm=False)[0]
    with_logprobs = dataclasses.replace(greedy, logprobs=True, top_logprobs=TOP)
    logprobs = llm.generate(PROMPTS[1], with_logprobs, use_tqdm=False)[0]
    chat = llm.chat(CONVERSATION, greedy, use_tqdm=False)[0]
    chat_logprobs = llm.chat(CONVERSATION, with_logprobs, use_tqdm=False)[0]
    app = build_app(llm, MODEL, api_key=API_KEY)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=5))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the test server did not start")
        time.sleep(0.02)
    port = sock.getsockname()[1]
    yield Served(f"http://127.0.0.1:{port}", llm, app.state.server.loop, refs, sampled, logprobs, chat, chat_logprobs)
    server.should_exit = True
    thread.join(10)
    sock.close()


@pytest.fixture(scope="package")
def client(served):
    import openai
    with openai.OpenAI(base_url=served.v1, api_key=API_KEY, max_retries=0, timeout=60) as c:
        yield c
