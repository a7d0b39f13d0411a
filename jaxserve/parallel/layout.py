"""The serving engine's device layout: one mesh ``{"data": D, "tensor": T}`` and where state lives on it.

Axis names: P pages, S page size, K kv heads, D head dim, E hidden size, H heads.

- ``"tensor"`` (T = ``tensor_parallel_size``): Megatron tensor parallelism. q/k/v/gate/up are
  column-parallel, o/down row-parallel (one all-reduce after each), attention runs per shard on its
  H/T heads and K/T KV heads, and the paged pool is sharded by KV head (block tables, lengths and
  slots replicated). When T exceeds the KV heads each KV head is replicated T/K times (as vLLM does):
  ``prepare`` repeats the k/v projections' columns, so each shard holds one KV head of its own.
- ``"data"`` (D = ``data_parallel_size``, only with expert parallelism): data-parallel attention
  beside expert-parallel MoE (DeepSeek / vLLM). Dense weights and the pool are replicated over it, every
  data shard computes the whole step's attention (one host scheduler, one batch), and each MoE layer
  splits the step's tokens over all D x T devices for the dispatch.
- expert parallelism (``enable_expert_parallel``): the experts of every MoE layer are split over
  ``("data", "tensor")``, all D x T devices, and dispatched / combined with ``all_to_all``
  (``jaxserve.moe.parallel.expert_parallel_routed``), padded (``lax.all_to_all``) or ragged
  (``lax.ragged_all_to_all``: live rows only) as ``moe_dispatch`` says (``resolve_moe_dispatch``). Without it,
  under T > 1 every expert is split on its intermediate dimension over ``"tensor"`` (vLLM: gate/up column-, down
  row-parallel, one all-reduce per MoE layer; ``jaxserve.moe.tensor_parallel``).

The mesh spans every visible device (all processes' under ``jax.distributed``), its first D x T.
"""
from __future__ import annotations

from dataclasses import dataclass

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jaxserve.cache.kv_pool import KVLayer, KVPool
from jaxserve.config import MOE_DISPATCHES, ModelConfig
from jaxserve.parallel.mesh import make_mesh
from jaxserve.parallel.sharding import DEFAULT_RULES, param_specs

DATA, TENSOR = "data", "tensor"


@dataclass(frozen=True)
class Layout:
    """A mesh and the engine's use of it (static and hashable: a jitted step's static argument)."""
    mesh: Mesh
    expert_parallel: bool = False
    moe_dispatch: str = "all_to_all"  # resolved: "all_to_all" (padded) | "ragged"

    @property
    def tensor_size(self) -> int:
        return self.mesh.shape[TENSOR]

    @property
    def data_size(self) -> int:
        return self.mesh.shape[DATA]

    @property
    def expert_axes(self) -> tuple[str, ...]:
        return (DATA, TENSOR)

    @property
    def axis_map(self) -> dict:
        """Logical axes of the rule table -> mesh axes."""
        ep = self.expert_parallel
        return {"tensor": TENSOR, "expert": self.expert_axes if ep else None, "expert_tensor": None if ep else TENSOR}

    def sharding(self, spec: P) -> NamedSharding:
        return NamedSharding(self.mesh, spec)

    def param_specs(self, params):
        return param_specs(params, self.mesh, DEFAULT_RULES, self.axis_map)

    def place_params(self, params):
        """Host params -> arrays on the mesh (from numpy, so every process places its own shards)."""
        specs = self.param_specs(params)
        return jax.tree.map(lambda x, s: jax.device_put(np.asarray(x), self.sharding(s)), params, specs)

    def place_replicated(self, tree):
        """Host arrays -> whole on every device of the mesh (None stays None)."""
        return jax.tree.map(lambda x: jax.device_put(np.asarray(x), self.sharding(P())), tree)

    def replicate(self, tree):
        """Inside a jitted step: every array of ``tree`` whole on every device (what goes back to the host)."""
        return jax.lax.with_sharding_constraint(tree, self.sharding(P()))

    # ---- the KV pool: sharded by KV head ----------------------------------------------------

    @staticmethod
    def kv_spec(k_tokens_minor: bool = False) -> P:
        """Pages [P, S, K, D] (or K as [P, K, D, S]) split on K."""
        return P(None, TENSOR, None, None) if k_tokens_minor else P(None, None, TENSOR, None)

    heads_spec = P(None, TENSOR, None)  # q, k, v [T, H or K, D] inside attention

    def layer_specs(self, layer: KVLayer) -> KVLayer:
        return layer.replace(k=self.kv_spec(layer.k_tokens_minor), v=self.kv_spec())

    def pool_specs(self, pool: KVPool) -> KVPool:
        return pool.replace(layers=tuple(self.layer_specs(layer) for layer in pool.layers))

    def constrain_pool(self, pool: KVPool) -> KVPool:
        """Inside a jitted step: keep the (donated) pool sharded as it came in."""
        return jax.lax.with_sharding_constraint(pool, jax.tree.map(self.sharding, self.pool_specs(pool)))

    def new_pool(self, build, sharded: bool = True) -> KVPool:
        """``build()`` (a zeroed pool) created directly on the mesh: sharded by KV head (never whole on one
        device), or replicated (``sharded=False``: a draft model's pool)."""
        specs = self.pool_specs(jax.eval_shape(build)) if sharded else P()
        return jax.jit(build, out_shardings=jax.tree.map(self.sharding, specs))()

    # ---- the model ---------------------------------------------------------------------------

    def prepare(self, config: ModelConfig, params: dict) -> tuple[ModelConfig, dict]:
        """The model as this layout runs it: with T > K, each KV head repeated T/K times (k/v columns)."""
        t, k = self.tensor_size, config.num_kv_heads
        if t <= k:
            return config, params
        reps = t // k
        layers = {name: _repeat_kv(layer, k, config.head_dim, reps) if name.startswith("layers_") else layer
                  for name, layer in params.items()}
        return config.replace(num_kv_heads=t), layers


def _repeat_kv(layer: dict, kv_heads: int, head_dim: int, reps: int) -> dict:
    attn = dict(layer["attn"])
    for name in ("k_proj", "v_proj"):
        proj = dict(attn[name])
        for leaf, x in proj.items():  # kernel [E, K*D], bias [K*D]: each head's D columns repeated
            x = np.asarray(x)
            heads = x.reshape(*x.shape[:-1], kv_heads, head_dim)
            proj[leaf] = np.repeat(heads, reps, axis=-2).reshape(*x.shape[:-1], kv_heads * reps * head_dim)
        attn[name] = proj
    return {**layer, "attn": attn}


def make_layout(config: ModelConfig, tensor_parallel_size: int = 1, data_parallel_size: int = 1,
                enable_expert_parallel: bool = False, devices=None, moe_dispatch: str = "auto") -> Layout | None:
    """The layout for these sizes (None for one device without expert parallelism); ValueErrors name the
    option and value that ``config`` or the visible devices cannot serve, before anything is built."""
    t, d, ep = tensor_parallel_size, data_parallel_size, enable_expert_parallel
    check_layout(config, t, d, ep)
    devices = jax.devices() if devices is None else devices
    dispatch = resolve_moe_dispatch(moe_dispatch, devices[0].platform)  # refused on CPU even where unused
    if t == d == 1 and not ep:
        return None
    if t * d > len(devices):
        raise ValueError(f"tensor_parallel_size={t} x data_parallel_size={d} needs {t * d} devices, "
                         f"only {len(devices)} visible")
    return Layout(make_mesh({DATA: d, TENSOR: t}, devices), ep, dispatch)


RAGGED_PLATFORMS = ("gpu", "tpu")  # where XLA implements ragged_all_to_all (not XLA:CPU)


def resolve_moe_dispatch(moe_dispatch: str, platform: str) -> str:
    """``moe_dispatch`` ("auto" | "all_to_all" | "ragged") on devices of ``platform`` -> "all_to_all" | "ragged".

    "auto" is ragged where the backend has ``ragged_all_to_all`` (it moves only the live rows), else the padded
    ``all_to_all``; "ragged" elsewhere is a ValueError naming the option."""
    if moe_dispatch not in MOE_DISPATCHES:
        raise ValueError(f"moe_dispatch must be one of {MOE_DISPATCHES}, got {moe_dispatch!r}")
    ragged_here = platform in RAGGED_PLATFORMS
    if moe_dispatch == "ragged" and not ragged_here:
        raise ValueError(f"moe_dispatch='ragged' needs lax.ragged_all_to_all, which XLA on platform {platform!r} "
                         f"does not implement (it does on {' and '.join(RAGGED_PLATFORMS)}); use 'auto' or "
                         f"'all_to_all'")
    if moe_dispatch == "auto":
        return "ragged" if ragged_here else "all_to_all"
    return moe_dispatch


def check_layout(config: ModelConfig, t: int, d: int, ep: bool) -> None:
    h, k = config.num_heads, config.num_kv_heads
    if h % t:
        raise ValueError(f"tensor_parallel_size={t} must divide the model's num_heads={h}")
    if k % t and t % k:
        raise ValueError(f"tensor_parallel_size={t} must divide the model's num_kv_heads={k} or be a multiple "
                         f"of it (KV heads are then replicated)")
    if ep and not config.num_experts:
        raise ValueError("enable_expert_parallel=True needs a Mixture-of-Experts model (num_experts=0)")
    if ep and config.num_experts % (t * d):
        raise ValueError(f"enable_expert_parallel=True splits num_experts={config.num_experts} over "
                         f"tensor_parallel_size x data_parallel_size = {t * d} devices: not divisible")
    i = config.expert_intermediate_size
    if config.num_experts and not ep and i % t:
        raise ValueError(f"tensor_parallel_size={t} must divide the experts' intermediate size {i} (each expert is "
                         f"split over the devices), or set enable_expert_parallel=True")
    if d > 1 and not ep:
        raise ValueError(f"data_parallel_size={d} needs enable_expert_parallel=True (data-parallel attention "
                         f"beside expert-parallel MoE); for independent replicas run one LLM per device group")
