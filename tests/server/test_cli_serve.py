"""``jaxserve serve MODEL [overrides]`` as a user starts it: a process that serves until interrupted."""
import httpx
import pytest

from jaxserve.bench.server_process import ServerProcess
from tests.server.conftest import PROMPTS

pytestmark = pytest.mark.xdist_group("server")


def test_jaxserve_serve_command(served):
    server = ServerProcess("jaxserve/tiny-code", ["engine.max_num_seqs=2", "engine.max_num_batched_tokens=32",
                                                  "engine.max_model_len=64"],
                           ["--no-warmup", "--served-model-name", "tc"], startup_timeout=60,
                           env={"JAXSERVE_API_KEY": "k"})
    with server as url:
        body = {"model": "tc", "prompt": PROMPTS[0], "max_tokens": 2, "temperature": 0}
        assert httpx.post(url + "/v1/completions", json=body).status_code == 401  # the key came from the env
        r = httpx.post(url + "/v1/completions", json=body, headers={"Authorization": "Bearer k"}, timeout=60)
        ids = served.greedy[PROMPTS[0]].outputs[0].token_ids[:2]
        assert r.json()["choices"][0]["text"] == served.llm.tokenizer.decode(ids)
        assert r.json()["model"] == "tc"
        assert httpx.get(url + "/v1/models", headers={"Authorization": "Bearer k"}).json()["data"][0][
            "max_model_len"] == 64
    assert server.returncode == 0  # SIGINT: a clean shutdown
