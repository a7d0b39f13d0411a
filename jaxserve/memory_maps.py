"""XLA:CPU maps each compiled kernel's code and data as pages of their own (~3 mappings a kernel, ~700 a step
program), kept while its executable lives in JAX's caches. A long process compiling many programs (a test worker,
an experiment's grid) would pass the kernel's limit (vm.max_map_count, 65530 by default), where the next mmap fails
and the process dies. ``release_programs`` drops JAX's caches once past a bound well under it."""
from __future__ import annotations

MAX_MEMORY_MAPS = 30_000  # under half of vm.max_map_count's default


def memory_maps() -> int:
    """This process's memory mappings (lines of /proc/self/maps; 0 where there is none)."""
    try:
        with open("/proc/self/maps", "rb") as f:
            return f.read().count(b"\n")
    except OSError:  # not Linux
        return 0


def release_programs(max_maps: int = MAX_MEMORY_MAPS) -> bool:
    """Clears JAX's compiled programs if this process holds over ``max_maps`` mappings; returns whether it did."""
    if memory_maps() <= max_maps:
        return False
    import gc

    import jax
    jax.clear_caches()
    gc.collect()
    return True
