"""A client that goes away aborts its request and frees its blocks; /metrics reports the engine."""
import json
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.server.conftest import API_KEY, MAX_TOKENS, MODEL, PROMPTS

pytestmark = pytest.mark.xdist_group("server")
AUTH = {"Authorization": f"Bearer {API_KEY}"}
LONG_RUN = {"model": MODEL, "prompt": PROMPTS[0], "max_tokens": 110, "ignore_eos": True, "temperature": 0}


def test_client_killed_mid_stream_leaks_no_blocks(served):
    idle = served.wait_idle()
    with httpx.Client(timeout=30) as http:
        with http.stream("POST", served.v1 + "/completions", json={**LONG_RUN, "stream": True}, headers=AUTH) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            events = [next(line for line in lines if line.startswith("data:")) for _ in range(2)]
            assert all(json.loads(e[5:])["choices"][0]["finish_reason"] is None for e in events)
            assert served.loop.stats()["kv_blocks_used"] > 0
        # leaving the block closes the connection mid-stream
    after = served.wait_idle()
    assert after["kv_blocks_free"] == idle["kv_blocks_free"] == after["kv_blocks_total"]
    assert after["requests_aborted_total"] == idle["requests_aborted_total"] + 1
    assert after["generation_tokens_total"] - idle["generation_tokens_total"] < LONG_RUN["max_tokens"]


def test_client_timing_out_on_a_plain_request_aborts_it(served):
    idle = served.wait_idle()
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(served.v1 + "/completions", json=LONG_RUN, headers=AUTH, timeout=httpx.Timeout(30, read=0.05))
    # on a loaded machine the request may reach the engine only after the client gave up
    after = served.wait_idle(until=lambda s: s["requests_aborted_total"] > idle["requests_aborted_total"])
    assert after["kv_blocks_free"] == after["kv_blocks_total"]
    assert after["requests_aborted_total"] == idle["requests_aborted_total"] + 1


def test_stop_string_frees_the_request_early(served):
    """Every choice hit a stop string: the engine request is aborted then, not run to max_tokens."""
    idle = served.wait_idle()
    text = served.greedy[PROMPTS[0]].outputs[0].text
    r = httpx.post(served.v1 + "/completions", json={**LONG_RUN, "stop": text[1:3]}, headers=AUTH, timeout=30)
    assert r.json()["choices"][0]["text"] == text[:text.find(text[1:3])]
    after = served.wait_idle()
    assert after["generation_tokens_total"] - idle["generation_tokens_total"] < 10
    assert after["kv_blocks_free"] == after["kv_blocks_total"]


def _metrics(served) -> dict:
    text = httpx.get(served.url + "/metrics").text
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples
            if s.labels.get("model_name") == MODEL}


def test_metrics(served):
    before = served.wait_idle()
    m = _metrics(served)
    assert m["jaxserve:kv_blocks_total"] == served.llm.engine.block_manager.num_blocks
    assert m["jaxserve:num_requests_running"] == 0 and m["jaxserve:num_requests_waiting"] == 0
    r = httpx.post(served.v1 + "/completions", headers=AUTH, timeout=30,
                   json={"model": MODEL, "prompt": [PROMPTS[3]] * 3, "max_tokens": MAX_TOKENS, "temperature": 0})
    assert r.status_code == 200
    served.wait_idle()
    time.sleep(0.6)  # the idle loop refreshes its snapshot every 0.5 s
    m2 = _metrics(served)
    generated = r.json()["usage"]["completion_tokens"]
    assert m2["jaxserve:generation_tokens_total"] - m["jaxserve:generation_tokens_total"] == generated
    assert m2["jaxserve:prompt_tokens_total"] - m["jaxserve:prompt_tokens_total"] == r.json()["usage"]["prompt_tokens"]
    assert m2["jaxserve:requests_finished_total"] - m["jaxserve:requests_finished_total"] == 3
    assert m2["jaxserve:generation_tokens_per_second"] > 0
    assert before["kv_blocks_free"] == before["kv_blocks_total"]


def test_metrics_prefix_cache_hits(served):
    """A 40-token prompt sent twice: the second finds its first two 16-token blocks cached."""
    body = {"model": MODEL, "prompt": list(range(1, 41)), "max_tokens": 2}
    for _ in range(2):
        assert httpx.post(served.v1 + "/completions", headers=AUTH, timeout=30, json=body).status_code == 200
    served.wait_idle()
    time.sleep(0.6)
    stats = served.llm.engine.block_manager.stats()  # read only while idle: the loop is waiting for commands
    assert stats.prefix_hit_tokens >= 32
    assert _metrics(served)["jaxserve:prefix_cache_hit_rate"] == pytest.approx(
        stats.prefix_hit_tokens / stats.prefix_query_tokens)
