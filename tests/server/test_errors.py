"""Bad requests get OpenAI-shaped errors with their status and the field named; the server keeps serving."""
import httpx
import pytest

from tests.server.conftest import API_KEY, ENGINE, MAX_TOKENS, MODEL, PROMPTS

pytestmark = pytest.mark.xdist_group("server")
AUTH = {"Authorization": f"Bearer {API_KEY}"}
OK = {"model": MODEL, "prompt": PROMPTS[0], "max_tokens": 2}
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
LONG = "x = 1\n" * 200  # far past max_model_len=128 tokens

CASES = [  # (endpoint, body, status, param, words in the message)
    ("completions", {**OK, "temperature": "hot"}, 422, "temperature", "valid number"),
    ("completions", {"model": MODEL, "max_tokens": 2}, 422, "prompt", "Field required"),
    ("completions", {**OK, "n": [2]}, 422, "n", "valid integer"),
    ("chat/completions", {**CHAT, "messages": [{"role": "robot", "content": "hi"}]}, 422, "messages.0.role",
     "'system'"),
    ("completions", {**OK, "top_p": 0}, 400, "top_p", "SamplingParams.top_p must be a finite number > 0"),
    ("completions", {**OK, "temperature": -1}, 400, "temperature", "SamplingParams.temperature"),
    ("completions", {**OK, "top_k": -5}, 400, "top_k", "SamplingParams.top_k"),
    ("completions", {**OK, "seed": -1}, 400, "seed", "SamplingParams.seed"),
    ("completions", {**OK, "n": 0}, 400, "n", "SamplingParams.n must be"),
    ("completions", {**OK, "n": ENGINE["max_num_seqs"] + 1}, 400, "n", "exceeds the server's max_num_seqs=8"),
    ("completions", {**OK, "max_tokens": 0}, 400, "max_tokens", "max_tokens must be >= 1, got 0"),
    ("completions", {**OK, "max_tokens": 500}, 400, "max_tokens", "maximum context length is 128 tokens"),
    ("completions", {**OK, "prompt": LONG}, 400, "prompt", "maximum context length is 128"),
    ("completions", {**OK, "prompt": []}, 400, "prompt", "must not be empty"),
    ("completions", {**OK, "prompt": [1, 2, 99999]}, 400, "prompt", "99999"),
    ("completions", {**OK, "stop_token_ids": [-3]}, 400, "stop_token_ids", "SamplingParams.stop_token_ids"),
    ("completions", {**OK, "stop": ["ok", ""]}, 400, "stop", "must not be empty"),
    ("completions", {**OK, "logprobs": 17}, 400, "logprobs", "logprobs must be between 0 and 16"),
    ("completions", {**OK, "logprobs": -1}, 400, "logprobs", "got -1"),
    ("completions", {**OK, "presence_penalty": 0.5}, 400, "presence_penalty", "not supported"),
    ("completions", {**OK, "echo": True}, 400, "echo", "not supported"),
    ("completions", {**OK, "model": "gpt-4"}, 404, "model", "'gpt-4' does not exist"),
    ("chat/completions", {**CHAT, "messages": []}, 400, "messages", "at least one message"),
    ("chat/completions", {**CHAT, "messages": [{"role": "user", "content": LONG}]}, 400, "messages",
     "maximum context length"),
    ("chat/completions", {**CHAT, "top_logprobs": 2}, 400, "top_logprobs", "needs logprobs=true"),
    ("chat/completions", {**CHAT, "logprobs": True, "top_logprobs": 17}, 400, "top_logprobs",
     "SamplingParams.top_logprobs must be"),
]


@pytest.fixture(scope="module")
def http(served):
    with httpx.Client(base_url=served.v1, timeout=30) as c:
        yield c


@pytest.mark.parametrize("endpoint, body, status, param, words", CASES,
                         ids=[f"{c[3]}-{c[2]}-{i}" for i, c in enumerate(CASES)])
def test_bad_request(http, served, endpoint, body, status, param, words):
    for stream in (False, True) if status == 400 and not body.get("stream") else (body.get("stream", False),):
        r = http.post(f"/{endpoint}", json={**body, "stream": stream}, headers=AUTH)
        assert r.status_code == status, r.text
        error = r.json()["error"]
        assert error["param"] == param
        assert words in error["message"]
        assert error["type"] == "invalid_request_error" if status < 500 else "server_error"
    assert served.wait_idle()["num_live"] == 0  # nothing was queued, or it was withdrawn


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": API_KEY}])
def test_wrong_or_missing_key_is_refused(http, headers):
    for method, path, body in (("POST", "/completions", OK), ("GET", "/models", None)):
        r = http.request(method, path, json=body, headers=headers)
        assert r.status_code == 401
        assert r.json()["error"]["code"] == "invalid_api_key"
    r = http.post("/completions", json={"bad": "body"}, headers=headers)
    assert r.status_code == 401  # the key is checked before the body


def test_openai_client_raises_on_wrong_key(served):
    import openai
    with openai.OpenAI(base_url=served.v1, api_key="nope", max_retries=0) as c:
        with pytest.raises(openai.AuthenticationError):
            c.completions.create(model=MODEL, prompt="x", max_tokens=1)


def test_still_serving_after_errors(http, served):
    for body in (c[1] for c in CASES[:6]):
        http.post("/completions", json=body, headers=AUTH)
    r = http.post("/completions", json={**OK, "max_tokens": MAX_TOKENS, "temperature": 0}, headers=AUTH)
    assert r.status_code == 200
    assert r.json()["choices"][0]["text"] == served.greedy[PROMPTS[0]].outputs[0].text


def test_health_and_unknown_route(served):
    assert httpx.get(served.url + "/health").json() == {"status": "ok"}  # no key needed
    r = httpx.get(served.url + "/v1/nothing", headers=AUTH)
    assert r.status_code == 404 and "error" in r.json()


def test_a_failing_step_is_a_500_and_the_server_goes_on(http, served, monkeypatch):
    engine, real_step = served.loop.engine, served.loop.engine.step
    calls = []

    def failing_step():  # fails once, before touching any state, as a device error would
        if not calls:
            calls.append(1)
            raise RuntimeError("device lost")
        return real_step()

    body = {**OK, "max_tokens": MAX_TOKENS, "temperature": 0}
    monkeypatch.setattr(engine, "step", failing_step)
    r = http.post("/completions", json=body, headers=AUTH)
    assert r.status_code == 500
    assert r.json()["error"] == {"message": "engine step failed: RuntimeError: device lost", "type": "server_error",
                                 "param": None, "code": None}
    assert served.wait_idle()["kv_blocks_free"] == served.loop.stats()["kv_blocks_total"]
    calls.clear()
    with http.stream("POST", "/completions", json={**body, "stream": True}, headers=AUTH) as r:
        events = [line for line in r.iter_lines() if line.startswith("data:")]
    assert r.status_code == 200 and "device lost" in events[-2] and events[-1] == "data: [DONE]"
    r = http.post("/completions", json=body, headers=AUTH)
    assert r.json()["choices"][0]["text"] == served.greedy[PROMPTS[0]].outputs[0].text
