"""The peer engines ``jaxserve bench`` compares with (vLLM's CPU backend, llama.cpp), the harness's side.

Each peer lives in its own venv, made once by ``benchmarks/peers/setup_<peer>.sh`` under the peers
folder (``$JAXSERVE_PEERS_DIR``, default ``benchmarks/peers/.envs`` of the source checkout, git-ignored),
and is driven as a subprocess running ``benchmarks/peers/<peer>_driver.py`` in that venv: the venv needs
no jaxserve, only the weights (an HF directory or a GGUF file) and a workload file. The line protocol is
in ``benchmarks/peers/peer_protocol.py``. Host code: no JAX.
"""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
from dataclasses import dataclass, field

REPO = pathlib.Path(__file__).resolve().parents[2]
DRIVERS = REPO / "benchmarks" / "peers"


@dataclass(frozen=True)
class Peer:
    name: str
    python: str  # the venv's interpreter, relative to the peers folder
    driver: str  # the driver script in benchmarks/peers/
    weights: str  # "hf" (a directory) or "gguf" (a file)
    setup: str  # the script that makes the venv
    env: dict[str, str] = field(default_factory=dict)  # values: paths relative to the peers folder


PEERS = {
    "vllm": Peer("vllm", "vllm/bin/python", "vllm_driver.py", "hf", "setup_vllm.sh"),
    "llama.cpp": Peer("llama.cpp", "llamacpp/venv/bin/python", "llamacpp_driver.py", "gguf", "setup_llamacpp.sh",
                      {"LLAMA_CPP_LIB_PATH": "llamacpp/lib"}),
}


def peers_dir() -> pathlib.Path:
    return pathlib.Path(os.environ.get("JAXSERVE_PEERS_DIR") or DRIVERS / ".envs")


def peer(name: str) -> Peer:
    if name not in PEERS:
        raise ValueError(f"unknown peer {name!r}; choose one of {sorted(PEERS)}")
    return PEERS[name]


def missing(name: str) -> str | None:
    """Why peer ``name`` cannot run here (None: it can)."""
    p, root = peer(name), peers_dir()
    if not (DRIVERS / p.driver).is_file():
        return f"the {name} driver {DRIVERS / p.driver} is not here (peers run from a source checkout)"
    if not (root / p.python).is_file():
        return f"the {name} venv is missing ({root / p.python}): run bash benchmarks/peers/{p.setup}"
    return None


class PeerError(RuntimeError):
    pass


class DriverProcess:
    """One peer driver subprocess, model loaded once, then ``run(workload_file)`` as often as asked."""

    def __init__(self, name: str, model_path: str | os.PathLike, *, threads: int, max_num_seqs: int,
                 max_model_len: int, dtype: str, log_path: str | os.PathLike, env: dict[str, str] | None = None):
        reason = missing(name)
        if reason:
            raise PeerError(reason)
        p, root = peer(name), peers_dir()
        self.name, self.log_path = name, str(log_path)
        read_fd, write_fd = os.pipe()
        env = dict(os.environ, **{k: str(root / v) for k, v in p.env.items()}, **(env or {}), PYTHONUNBUFFERED="1")
        env.pop("PYTHONPATH", None)  # the peer's venv, not this process's packages
        cmd = [str(root / p.python), str(DRIVERS / p.driver), "--model", str(model_path), "--threads", str(threads),
               "--max-num-seqs", str(max_num_seqs), "--max-model-len", str(max_model_len), "--dtype", dtype,
               "--reply-fd", str(write_fd)]
        self._log = open(log_path, "w")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=self._log, stderr=subprocess.STDOUT,
                                     env=env, pass_fds=(write_fd,), text=True, cwd=str(DRIVERS))
        os.close(write_fd)
        self._replies = os.fdopen(read_fd)
        self.info = self._reply("loading the model")

    def _reply(self, what: str) -> dict:
        line = self._replies.readline()
        if not line:
            self.proc.wait()
            raise PeerError(f"the {self.name} driver exited (code {self.proc.returncode}) while {what}; "
                            f"its log: {self.log_path}\n{_tail(self.log_path)}")
        reply = json.loads(line)
        if "error" in reply:
            raise PeerError(f"{self.name} driver, {what}: {reply['error']}\n{reply.get('traceback', '')}")
        return reply

    def run(self, workload_path: str | os.PathLike) -> dict:
        self.proc.stdin.write(json.dumps({"workload": str(workload_path)}) + "\n")
        self.proc.stdin.flush()
        return self._reply(f"running {workload_path}")

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write('{"quit": true}\n')
                self.proc.stdin.close()
                self.proc.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self._replies.close()
        self._log.close()


def _tail(path: str, n: int = 30) -> str:
    try:
        return "\n".join(pathlib.Path(path).read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""
