"""Building the CPU kernels' library (jaxserve/kernels/cpu/build.py) with a stand-in compiler: a shell script that
logs each call and writes its output file, so these tests need no real compile."""
import threading

import pytest

from jaxserve.kernels.cpu import build

FAKE_CXX = """#!/bin/sh
echo "$@" >> "{log}"
[ "$1" = --version ] && {{ echo fake-c++ 1.0; exit 0; }}
{fail}
while [ $# -gt 0 ]; do [ "$1" = -o ] && {{ sleep 0.2; echo built > "$2"; }}; shift; done
"""


def fake_compiler(tmp_path, monkeypatch, fail: bool = False):
    log = tmp_path / "calls.log"
    cxx = tmp_path / "fake-c++"
    cxx.write_text(FAKE_CXX.format(log=log, fail='case "$*" in *amx.cc*) echo "amx.cc:1: error: no" >&2; exit 1;; '
                                                  'esac' if fail else ""))
    cxx.chmod(0o755)
    monkeypatch.setattr(build, "compiler", lambda: str(cxx))
    monkeypatch.setenv("JAXSERVE_CACHE_DIR", str(tmp_path / "cache"))
    return log


def test_concurrent_builds_compile_once_and_share_the_library(tmp_path, monkeypatch):
    log = fake_compiler(tmp_path, monkeypatch)
    libs = []
    threads = [threading.Thread(target=lambda: libs.append(build.build())) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(libs)) == 1 and libs[0].read_text() == "built\n"
    calls = [line for line in log.read_text().splitlines() if line != "--version"]
    # each source compiled to an object once, then one link of the objects into the shared library
    assert sorted(c.split(" -c ")[1].split()[0] for c in calls if " -c " in c) == sorted(map(str, build.SOURCES))
    links = [c for c in calls if " -c " not in c]
    assert len(links) == 1 and "-shared" in links[0] and links[0].count(".o") == len(build.SOURCES)
    assert sorted(p.name for p in libs[0].parent.iterdir()) == ["build.lock", build.LIBRARY]  # no temporaries left
    assert build.build() == libs[0] and len(log.read_text().splitlines()) == len(calls) + 4  # cached: no compile


def test_a_failed_compile_names_the_source_and_leaves_no_library(tmp_path, monkeypatch):
    fake_compiler(tmp_path, monkeypatch, fail=True)
    with pytest.raises(RuntimeError, match=r"(?s)compiling amx\.cc failed \(.*\):\namx\.cc:1: error: no"):
        build.build()
    out_dirs = list((tmp_path / "cache" / "cpu_kernels").iterdir())
    assert len(out_dirs) == 1 and [p.name for p in out_dirs[0].iterdir()] == ["build.lock"]
