"""Pallas kernels for jaxserve: each with kernel, pallas_call wrapper, validated public function and jnp reference."""
