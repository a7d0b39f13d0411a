"""``jaxserve.host_malloc``: XLA:CPU's scratch buffers are reused between runs instead of page-faulted in.

Each check runs in a fresh interpreter, since the setting must precede JAX's threads."""
import json
import os
import subprocess
import sys

import pytest

from jaxserve import host_malloc

# The sampler drawing at temperature 1 over a batch-64 row of SmolLM2's vocabulary: its Gumbel noise and filtered
# logits are tens of MB of XLA:CPU scratch per run, which glibc's defaults map and unmap every time. (A greedy batch
# no longer makes it: argmax_first's chunked reductions need no [64, 49152] temporaries.)
PROBE = r"""
import json, resource
import jaxserve  # applies (or not) the setting before JAX starts
import jax, jax.numpy as jnp, numpy as np
from jaxserve import host_malloc, sampling
R, V = 64, 49152
logits = jnp.asarray(np.random.default_rng(0).standard_normal((R, V)), jnp.float32)
batch = sampling.SamplingBatch(temperature=jnp.ones(R), top_k=jnp.zeros(R, jnp.int32), top_p=jnp.ones(R),
                               seed=jnp.arange(R, dtype=jnp.uint32), index=jnp.zeros(R, jnp.int32),
                               position=jnp.zeros(R, jnp.int32))
run = jax.jit(sampling.sample)
jax.block_until_ready(run(logits, batch))
jax.block_until_ready(run(logits, batch))
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    jax.block_until_ready(run(logits, batch))
faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 10
print(json.dumps({"applied": host_malloc.retain_freed_memory(), "faults_per_run": faults}))
"""


def probe(setting: str) -> dict:
    env = dict(os.environ, **{host_malloc.ENV: setting})
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(host_malloc._glibc() is None, reason="the setting is glibc's")
def test_scratch_buffers_are_reused_not_refaulted():
    system, retained = probe("system"), probe("retain")
    assert (system["applied"], retained["applied"]) == (False, True)
    # glibc's defaults: every run faults in its scratch afresh (~15,400 pages of 4 KiB on the Xeon VM, against
    # ~1,300 retained: the rest are not the scratch's)
    assert system["faults_per_run"] > 3000, system
    assert retained["faults_per_run"] < system["faults_per_run"] / 2, (system, retained)


def test_unknown_setting_is_refused_naming_the_variable():
    env = dict(os.environ, **{host_malloc.ENV: "tcmalloc"})
    out = subprocess.run([sys.executable, "-c", "import jaxserve"], env=env, capture_output=True, text=True)
    assert out.returncode != 0
    assert "JAXSERVE_HOST_MALLOC must be 'retain' or 'system', got 'tcmalloc'" in out.stderr
