"""Post-training weight quantization of a params pytree, and its memory accounting.

A *Dense kernel* is a params leaf named ``kernel`` with two axes ``[K, N]`` (an ``nn.Dense``
stores ``[in, out]``). ``quantize_params`` replaces the selected ones by a ``QuantizedTensor``
quantized along K (axis 0), the layout ``fp4_matmul`` reads; every other leaf is returned as is
(the same array objects). MoE expert banks (``gate_proj`` ``[E, H, I]`` leaves) and routers are
not Dense kernels and are never touched.

Selection, on the leaf's path ``"layers_0/attn/q_proj/kernel"``: a pattern matches when it equals
one of the path's components or, as an ``fnmatch`` glob, the whole path. A kernel is quantized when
it matches ``include`` (None: every kernel), matches no ``exclude`` pattern, has at least
``min_size`` elements, and its K is a multiple of the format's block size (16 nvfp4, 32 mxfp4,
``group_size`` int4); ``kernel_plan`` says which and why not.

``lm_head=True`` also quantizes what the LM head reads: an ``lm_head`` Dense kernel, or, where there is none (a
tied head), the embedding table ``embed/embedding`` [V, E] along E (axis 1), which ``use_quantized_matmul`` then
reads as the head (``x @ e^T``) and whose lookup dequantizes only the looked-up rows.
"""
from __future__ import annotations

import dataclasses
import fnmatch
import math

import jax
import jax.numpy as jnp

from pallas_kernels.fp4 import FORMATS, QuantizedTensor, dequantize, quantize

DEFAULT_EXCLUDE = ("embed", "lm_head", "router")
QUANTIZE = "quantize"


def leaf_path(path) -> str:
    """A params key path as "layers_0/attn/q_proj/kernel"."""
    return "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)


def path_matches(path: str, pattern: str) -> bool:
    """The selection rule: pattern equals a component of the '/'-joined path, or globs the whole path."""
    return pattern in path.split("/") or fnmatch.fnmatchcase(path, pattern)


def _block_size(fmt: str, opts: dict) -> int:
    return {"nvfp4": 16, "mxfp4": 32, "int4": opts.get("group_size", 128)}.get(fmt, 1)


def _validate_format(fmt: str, opts: dict) -> None:
    if fmt not in FORMATS:
        raise ValueError(f"unknown quantization format {fmt!r}; expected one of {FORMATS}")
    bs = _block_size(fmt, opts)
    probe = jnp.ones((bs if isinstance(bs, int) and bs > 0 else 1, 1), jnp.float32)
    quantize(probe, fmt, axis=0, **opts)  # raises ValueError for unknown or bad options


def _is_kernel(path: str, leaf) -> bool:
    return path.rsplit("/", 1)[-1] == "kernel" and getattr(leaf, "ndim", 0) == 2


def kernel_plan(params, fmt: str, *, include=None, exclude=DEFAULT_EXCLUDE, min_size: int = 0,
                **format_opts) -> dict[str, str]:
    """Every Dense kernel's path -> ``"quantize"`` or the reason it stays in float."""
    _validate_format(fmt, format_opts)
    bs = _block_size(fmt, format_opts)
    include = (include,) if isinstance(include, str) else include
    exclude = (exclude,) if isinstance(exclude, str) else tuple(exclude)
    plan = {}
    for path, leaf in jax.tree_util.tree_leaves_with_path(params):
        p = leaf_path(path)
        if not _is_kernel(p, leaf):
            continue
        if include is not None and not any(path_matches(p, pat) for pat in include):
            plan[p] = "not included"
        elif any(path_matches(p, pat) for pat in exclude):
            plan[p] = "excluded"
        elif math.prod(leaf.shape) < min_size:
            plan[p] = f"smaller than min_size={min_size}"
        elif leaf.shape[0] % bs:
            plan[p] = f"K={leaf.shape[0]} is not a multiple of the {fmt} block size {bs}"
        else:
            plan[p] = QUANTIZE
    return plan


def _is_embedding(path: str, leaf) -> bool:
    return path.rsplit("/", 1)[-1] == "embedding" and "embed" in path.split("/") and getattr(leaf, "ndim", 0) == 2


def quantize_params(params, fmt: str, *, include=None, exclude=DEFAULT_EXCLUDE, min_size: int = 0,
                    lm_head: bool = False, **format_opts):
    """params pytree -> the same pytree with the selected Dense kernels ``[K, N]`` as QuantizedTensors.

    fmt: "nvfp4" | "mxfp4" | "fp8" | "int4"; format_opts as ``pallas_kernels.fp4.quantize``
    (``scale_rule`` for mxfp4, ``scaling`` for fp8, ``group_size`` for int4). include / exclude:
    path patterns or one pattern (see the module docstring); min_size: smallest kernel (elements) to quantize;
    lm_head: also the LM head, a tied one as the embedding table along E (module docstring).
    Raises ValueError for an unknown format or option. Run the result through ``use_quantized_matmul``.
    """
    if not isinstance(lm_head, bool):
        raise TypeError(f"quantize_params: lm_head must be a bool, got {lm_head!r}")
    exclude = (exclude,) if isinstance(exclude, str) else tuple(exclude)
    if lm_head:
        exclude = tuple(p for p in exclude if p != "lm_head")
    plan = kernel_plan(params, fmt, include=include, exclude=exclude, min_size=min_size, **format_opts)
    bs = _block_size(fmt, format_opts)
    tied = lm_head and not any(path_matches(p, "lm_head") for p in plan)

    def one(path, leaf):
        p = leaf_path(path)
        if tied and _is_embedding(p, leaf) and leaf.shape[1] % bs == 0:
            return quantize(leaf, fmt, axis=1, **format_opts)
        if plan.get(p) != QUANTIZE:
            return leaf
        return quantize(leaf, fmt, axis=0, **format_opts)

    return jax.tree_util.tree_map_with_path(one, params)


def quantized_shapes(params, fmt: str, **kwargs):
    """What ``quantize_params(params, fmt, **kwargs)`` returns, as shapes (``jax.ShapeDtypeStruct`` leaves,
    QuantizedTensors with their static fields), computed without quantizing."""
    return jax.eval_shape(lambda p: quantize_params(p, fmt, **kwargs), params)


def is_quantized(leaf) -> bool:
    return isinstance(leaf, QuantizedTensor)


def dequantize_params(qparams, dtype=None):
    """QuantizedTensors -> float arrays (their source dtype unless ``dtype``); other leaves unchanged."""
    def one(leaf):
        return dequantize(leaf, dtype or leaf.dtype) if is_quantized(leaf) else leaf
    return jax.tree.map(one, qparams, is_leaf=is_quantized)


def weight_bytes(params) -> int:
    """Bytes a params pytree holds (QuantizedTensors count codes + scales + tensor scale)."""
    leaves = jax.tree.leaves(params, is_leaf=is_quantized)
    return sum(x.nbytes if is_quantized(x) else int(x.size) * jnp.dtype(x.dtype).itemsize for x in leaves)


@dataclasses.dataclass(frozen=True)
class QuantizationReport:
    """Weight memory of a params pytree before/after ``quantize_params``."""
    bytes_before: int
    bytes_after: int
    num_quantized: int       # kernels replaced
    quantized_elements: int  # weights they hold
    quantized_bytes: int     # bytes those kernels now take (codes + scales)

    @property
    def bits_per_quantized_weight(self) -> float:
        return 8.0 * self.quantized_bytes / max(self.quantized_elements, 1)

    @property
    def compression(self) -> float:
        return self.bytes_before / max(self.bytes_after, 1)


def quantization_report(params, qparams) -> QuantizationReport:
    """Compare a float params pytree with its quantized version (as returned by quantize_params)."""
    qts = [x for x in jax.tree.leaves(qparams, is_leaf=is_quantized) if is_quantized(x)]
    return QuantizationReport(
        bytes_before=weight_bytes(params), bytes_after=weight_bytes(qparams), num_quantized=len(qts),
        quantized_elements=sum(math.prod(q.shape) for q in qts), quantized_bytes=sum(q.nbytes for q in qts))
