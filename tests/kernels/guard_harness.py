"""Building a guard-page harness (``*_guard_pages.cc``, on ``guard_pages.h``) against the kernels' sources."""
import subprocess
from pathlib import Path

import jax

from jaxserve.kernels.cpu import build


def build_harness(source: str, tmp_path: Path) -> Path:
    """Compiles ``source`` (a file beside this one) as the kernels are compiled, and returns the executable."""
    exe = tmp_path / Path(source).stem
    cmd = [build.compiler(), "-O2", "-march=native", "-std=c++17", "-w", f"-I{jax.ffi.include_dir()}",
           f"-I{build.SOURCE_DIR}", str(Path(__file__).with_name(source)), "-o", str(exe)]
    subprocess.run(cmd, check=True, capture_output=True, timeout=300)
    return exe
