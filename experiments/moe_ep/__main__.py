import os

# 8 simulated CPU devices for the meshes; must be set before anything imports jax.
os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"

from experiments.harness import main  # noqa: E402

main("moe_ep")
