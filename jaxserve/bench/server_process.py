"""A ``jaxserve serve`` process for benchmarks (host, no JAX): started on a free 127.0.0.1 port, ready once
``/health`` answers, stopped with SIGINT (then killed if it does not exit).

    with ServerProcess("jaxserve/tiny-code", ["engine.kv_allocation=orca_max"]) as url:
        ...  # url is "http://127.0.0.1:PORT"

The server runs in its own process, so a benchmark client in this one shares no interpreter lock with the
engine loop. Its output goes to a temporary log whose tail is in the error if it fails to start.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Sequence


def free_port() -> int:
    """A TCP port on 127.0.0.1 free now (the OS's ephemeral choice)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """``jaxserve serve MODEL [args] [overrides]``; ``__enter__`` returns its base URL once it is healthy."""

    def __init__(self, model: str, overrides: Sequence[str] = (), args: Sequence[str] = (), *,
                 startup_timeout: float = 600.0, env: dict | None = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.cmd = [sys.executable, "-m", "jaxserve.cli", "serve", model, "--port", str(self.port),
                    "--log-level", "warning", *args, *overrides]
        self._timeout, self._env = startup_timeout, env
        self._proc: subprocess.Popen | None = None
        self._log = None

    def __enter__(self) -> str:
        import httpx
        self._log = tempfile.TemporaryFile("w+")
        self._proc = subprocess.Popen(self.cmd, stdout=self._log, stderr=subprocess.STDOUT,
                                      env={**os.environ, **(self._env or {})})
        deadline = time.monotonic() + self._timeout
        while True:
            try:
                if httpx.get(self.url + "/health", timeout=5).status_code == 200:
                    return self.url
            except httpx.TransportError:
                pass
            if self._proc.poll() is not None or time.monotonic() > deadline:
                tail = self.log_tail()
                self.__exit__(None, None, None)
                raise RuntimeError(f"`{' '.join(self.cmd)}` did not become healthy within {self._timeout:.0f} s "
                                   f"(exit code {self._proc.returncode}); its output ends:\n{tail}")
            time.sleep(0.2)

    def __exit__(self, *exc) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGINT)
            try:
                self._proc.wait(30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None

    @property
    def returncode(self) -> int | None:
        return None if self._proc is None else self._proc.returncode

    def log_tail(self, chars: int = 3000) -> str:
        if self._log is None:
            return ""
        self._log.flush()
        self._log.seek(0)
        return self._log.read()[-chars:]
