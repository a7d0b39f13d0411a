"""Compiling the CPU kernels (``matmul.cc``, ``attention.cc``, ``amx.cc`` and their shared ``parallel.h``) once per machine
into one library, ``jaxserve_cpu_kernels.so``, and registering its handlers as XLA FFI targets.

The shared library is built on first use with the system C++ compiler against the jaxlib headers
(``jax.ffi.include_dir()``), ``-O3 -march=native``, into
``$JAXSERVE_CACHE_DIR`` (default ``~/.cache/jaxserve``) ``/cpu_kernels/<key>/``, the key hashing the
sources and the header, the jaxlib version, the compiler, the flags and the CPU's feature flags, so that an upgrade,
an edit or another machine sharing the home directory gets its own build. One process builds while the others wait on
a file lock, and the library is renamed into place once linked: no process loads half a file.

``matmul.cc`` holds two implementations of the matmuls, chosen by the compiler's target: AVX-512 (F, BW
and BF16) and AVX2+FMA, so either instruction set suffices (``CPU_FLAG_SETS``); ``attention.cc`` is written once,
with the compiler's vector extensions, for both; ``amx.cc``'s bf16 GEMMs are compiled where the compiler targets AMX-BF16
(else their handlers report an error, and ``jaxserve_amx_enable`` 0: ``matmul.amx_usable``), the packed GEMM's
float32-FMA implementation (``packed_fma.h``, included by ``amx.cc``) everywhere. Anything missing (not
Linux/x86 with AVX-512 F+BW or AVX2+FMA, no compiler, a failed build or load) makes ``load()`` return
None after one logged warning; callers then keep XLA's dot.

The float32 GEMM handlers (``jaxserve_f32_gemm_*``, many rows) call OpenBLAS's ``cblas_sgemm`` from the
``scipy-openblas32`` wheel: ``load_blas()`` loads it with ctypes and hands the function's address to the library
(``jaxserve_set_sgemm``), so the build does not link against it; a missing wheel or symbol makes it return None
after one logged warning, and those matmuls keep XLA's dot.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import importlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import jax

log = logging.getLogger(__name__)

SOURCE_DIR = Path(__file__).parent
SOURCES = (SOURCE_DIR / "matmul.cc", SOURCE_DIR / "attention.cc", SOURCE_DIR / "amx.cc", SOURCE_DIR / "vnni.cc")
HEADERS = (SOURCE_DIR / "parallel.h", SOURCE_DIR / "fp4_scales.h", SOURCE_DIR / "packed_gemm.h",
           SOURCE_DIR / "packed_fma.h")
LIBRARY = "jaxserve_cpu_kernels.so"
TARGETS = ("jaxserve_bf16_matmul_kn", "jaxserve_bf16_matmul_nk", "jaxserve_f32_matmul_kn", "jaxserve_f32_matmul_nk",
           "jaxserve_fp4_matmul_kn", "jaxserve_fp4_matmul_nk", "jaxserve_f32_gemm_kn", "jaxserve_f32_gemm_nk",
           "jaxserve_bf16_gemm_kn", "jaxserve_bf16_gemm_nk", "jaxserve_bf16_gemm_packed", "jaxserve_f32_gemm_packed",
           "jaxserve_paged_attention", "jaxserve_paged_attention_bf16", "jaxserve_paged_attention_write",
           "jaxserve_paged_attention_write_bf16", "jaxserve_fp4_w4a8_matmul_kn",
           "jaxserve_int8_head_matmul")
# /proc/cpuinfo flags of each instruction set matmul.cc has kernels for; any one set suffices. (An AVX-512 CPU
# without avx512_bf16 builds the AVX2 kernels: every AVX-512 CPU has AVX2 and FMA too.)
CPU_FLAG_SETS = {"AVX-512": ("avx512f", "avx512bw"), "AVX2+FMA": ("avx2", "fma")}
BLAS_MODULE, BLAS_SGEMM = "scipy_openblas32", "scipy_cblas_sgemm"  # the wheel, and its prefixed cblas_sgemm
FLAGS = ("-O3", "-march=native", "-std=c++17", "-shared", "-fPIC", "-w")


def cpu_flags() -> frozenset[str]:
    """The CPU feature flags /proc/cpuinfo reports (empty off Linux)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def compiler() -> str | None:
    """The C++ compiler: $CXX, else the first of g++, c++, clang++ on PATH."""
    if os.environ.get("CXX"):
        return shutil.which(os.environ["CXX"])
    return next((p for p in map(shutil.which, ("g++", "c++", "clang++")) if p), None)


def unavailable_reason() -> str | None:
    """Why the kernels cannot be built here, or None when they can be tried."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return f"not an x86-64 CPU ({platform.machine()})"
    flags = cpu_flags()
    missing = {name: [f for f in need if f not in flags] for name, need in CPU_FLAG_SETS.items()}
    if all(missing.values()):
        lacks = " nor ".join(f"{name} (lacks {', '.join(m)})" for name, m in missing.items())
        return f"the CPU has neither {lacks}"
    if compiler() is None:
        return "no C++ compiler (g++, c++, clang++ or $CXX) on PATH"
    return None


def _cache_root() -> Path:
    return Path(os.environ.get("JAXSERVE_CACHE_DIR", Path.home() / ".cache" / "jaxserve")) / "cpu_kernels"


def _build_key(cxx: str) -> str:
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30).stdout
    h = hashlib.sha256()
    for path in (*SOURCES, *HEADERS):
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    for part in (_jaxlib_version(), cxx, version, " ".join(FLAGS), " ".join(sorted(cpu_flags()))):
        h.update(b"\0" + str(part).encode())
    return h.hexdigest()[:20]


def _jaxlib_version() -> str:
    import jaxlib
    return getattr(jaxlib, "__version__", "") or getattr(getattr(jaxlib, "version", None), "__version__", "")


def build() -> Path:
    """The compiled library's path, compiling it first if this machine's cache lacks it. Processes starting at once
    (pytest's workers, the subprocesses they start) take a file lock: one compiles, the others wait for its file."""
    import fcntl
    cxx = compiler()
    out_dir = _cache_root() / _build_key(cxx)
    lib = out_dir / LIBRARY
    if lib.exists():
        return lib
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or the process dies
        if not lib.exists():
            _compile(cxx, out_dir, lib)
    return lib


def _compile(cxx: str, out_dir: Path, lib: Path) -> None:
    """Each source to an object file, up to one compiler per core at once (a source takes 5-11 s: the build took 26 s
    as one compiler call, 19 s so on 2 cores), then one link, into a temporary name renamed to ``lib``."""
    from concurrent.futures import ThreadPoolExecutor

    def run(what: str, cmd: list[str]) -> None:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if proc.returncode:
            raise RuntimeError(f"{what} failed ({' '.join(cmd)}):\n{proc.stderr[-2000:]}")

    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        objects = [os.path.join(tmp, f"{src.stem}.o") for src in SOURCES]
        compile_flags = [f for f in FLAGS if f != "-shared"]
        include = [f"-I{jax.ffi.include_dir()}", f"-I{SOURCE_DIR}"]
        with ThreadPoolExecutor(max_workers=min(len(SOURCES), os.cpu_count() or 1)) as pool:
            list(pool.map(run, (f"compiling {src.name}" for src in SOURCES),
                          ([cxx, *compile_flags, *include, "-c", str(src), "-o", obj]
                           for src, obj in zip(SOURCES, objects))))
        linked = os.path.join(tmp, LIBRARY)
        run(f"linking {LIBRARY}", [cxx, *FLAGS, *objects, "-o", linked])
        os.replace(linked, lib)


@functools.lru_cache(maxsize=None)
def load() -> ctypes.CDLL | None:
    """Build (once), load and register the FFI targets; None, with one warning, where that fails."""
    reason = unavailable_reason()
    if reason is None:
        try:
            lib = ctypes.CDLL(str(build()))
            for name in TARGETS:
                jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(getattr(lib, name)), platform="cpu")
            return lib
        except Exception as e:  # noqa: BLE001 - any failure means: keep XLA's dot
            reason = f"{type(e).__name__}: {e}"
    log.warning("jaxserve CPU kernels unavailable (%s); using XLA's dot and attention", reason)
    return None


@functools.lru_cache(maxsize=None)
def load_blas() -> ctypes.CDLL | None:
    """Load OpenBLAS (the ``scipy-openblas32`` wheel) and hand its sgemm to the kernels, once; OpenBLAS's CDLL, or
    None, with one warning, where the kernels, the wheel or the symbol are missing.

    OpenBLAS is set to one thread: the handlers split N over XLA's intra-op pool instead (``parallel_chunks``, whose
    caller does every block a helper has not claimed). OpenBLAS's own two threads wait on each other: on the 2-core
    Zen 4, shared with other jobs (load average 3.2-3.7), q/o [576,576] took per matmul 1046 / 1747 / 1920 / 24757 us
    at M = 17 / 32 / 64 / 256 with them against 395 / 556 / 922 / 2946 us with one thread (XLA's dot 552 / 739 /
    1022 / 3680), and a run of 20 at M=64 swung between 0.53 and 24 ms per matmul (a descheduled thread);
    ``benchmarks/cpu_matmul.py --paths xla_f32,blas``. Splitting over 1 or 2 pool threads measured alike there
    (the machine's load left about one core); 2 (``default_threads``) as the other kernels."""
    lib = load()
    if lib is None:
        return None  # load() has warned
    try:
        wheel = importlib.import_module(BLAS_MODULE)
        blas = ctypes.CDLL(os.path.join(wheel.get_lib_dir(), wheel.get_library(fullname=True)))
        sgemm = getattr(blas, BLAS_SGEMM)
        blas.scipy_openblas_set_num_threads(1)
        lib.jaxserve_set_sgemm(ctypes.cast(sgemm, ctypes.c_void_p))
        return blas
    except Exception as e:  # noqa: BLE001 - any failure means: keep XLA's dot for many rows
        log.warning("OpenBLAS for float32 GEMMs unavailable (%s: %s; pip install scipy-openblas32); using XLA's dot",
                    type(e).__name__, e)
        return None
