"""``jaxserve serve MODEL [overrides]`` as a user starts it: a process that serves until interrupted."""
import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest

from tests.server.conftest import PROMPTS

pytestmark = pytest.mark.xdist_group("server")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_jaxserve_serve_command(served):
    port = _free_port()
    cmd = [sys.executable, "-m", "jaxserve.cli", "serve", "jaxserve/tiny-code", "--port", str(port), "--no-warmup",
           "--served-model-name", "tc", "--log-level", "warning", "engine.max_num_seqs=2",
           "engine.max_num_batched_tokens=32", "engine.max_model_len=64"]
    proc = subprocess.Popen(cmd, env={**os.environ, "JAXSERVE_API_KEY": "k"}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(url + "/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read() if proc.poll() else ""
            time.sleep(0.2)
        body = {"model": "tc", "prompt": PROMPTS[0], "max_tokens": 2, "temperature": 0}
        assert httpx.post(url + "/v1/completions", json=body).status_code == 401  # the key came from the env
        r = httpx.post(url + "/v1/completions", json=body, headers={"Authorization": "Bearer k"}, timeout=60)
        ids = served.greedy[PROMPTS[0]].outputs[0].token_ids[:2]
        assert r.json()["choices"][0]["text"] == served.llm.tokenizer.decode(ids)
        assert r.json()["model"] == "tc"
        assert httpx.get(url + "/v1/models", headers={"Authorization": "Bearer k"}).json()["data"][0][
            "max_model_len"] == 64
    finally:
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(30)
    assert rc == 0
