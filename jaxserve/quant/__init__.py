"""Post-training weight quantization: a quantized params pytree and the matmul that reads it.

    qparams = quantize_params(params, "nvfp4")          # Dense kernels [K, N] -> QuantizedTensor (along K)
    quantization_report(params, qparams)                # bytes before/after, bits per quantized weight
    with use_quantized_matmul("reference" | "pallas" | "mosaic" | "auto", w4a4=False):
        logits = forward_full(qparams, config, tokens)  # model code unchanged
    jax.jit(quantized_apply(forward_full, "pallas"), static_argnums=1)(qparams, config, tokens)

Defaults keep ``embed``, ``lm_head`` and MoE routers in float; MoE expert banks are not Dense
kernels and stay in float. ``impl="auto"`` runs the Pallas kernel on GPU/TPU; on CPU, for up to 16
rows (decoding), the AVX-512 or AVX2 FFI kernel ``jaxserve.kernels.cpu.fp4_matmul_cpu`` where it can be built
(``JAXSERVE_CPU_KERNELS=0``: off), else the dequantize-then-dot reference; fp8 and int4 always take the
reference path.
On a Hopper GPU "auto"/"pallas" run the Mosaic GPU kernel where it applies (``matmul.kernel_for``).

Plugging into the engine (``LLM(..., quantization="nvfp4")``):

1. Once, after loading and before building ``LLMEngine`` (``jaxserve/engine/llm.py``)::

       params = quantize_params(params, quantization)   # host-side, one time

   (for "mxfp4", pass ``scale_rule=...`` if wanted; ``kernel_plan`` lists what stays in float).
2. In ``jaxserve/engine/runner.py``, run the ``forward(...)`` call inside the jitted ``_step`` under
   the settings, and make the settings a static argument of ``_step`` (``MatmulSettings`` is a
   frozen, hashable dataclass)::

       @functools.partial(jax.jit, static_argnames=("config", "attention_impl", "quant"), ...)
       def _step(params, kv_pool, ..., *, config, attention_impl, quant=None):
           with matmul_context(quant):          # nullcontext when quant is None
               logits, kv_pool = forward(params, config, ...)

   with ``ModelRunner(..., quant=MatmulSettings(impl="auto"))`` when quantized, None otherwise,
   passed on as ``_step(..., quant=self.quant)``. ``_step`` is one module-level jit shared by every
   runner, and the settings are not in the params' treedef (an nvfp4 tree looks the same for
   weights-only and W4A4, pallas and reference): without the static argument, a cache hit would
   reuse a trace made under other settings. tests/quant checks this pattern
   (``test_settings_as_a_static_argument_keep_jit_traces_apart``).

Checked by hand (2026-11-29, CPU): ``LLM.from_params(config, quantize_params(params, "nvfp4"))``
generating inside ``with use_quantized_matmul("reference"):`` gives the same greedy tokens as the
engine on ``dequantize_params(...)`` of those params: the engine passes the QuantizedTensor pytree
through its jit, donation and buckets unchanged.
"""
from typing import TYPE_CHECKING

from jaxserve.lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "DEFAULT_EXCLUDE": "jaxserve.quant.params",
    "IMPLS": "jaxserve.quant.matmul",
    "MatmulSettings": "jaxserve.quant.matmul",
    "QuantizationReport": "jaxserve.quant.params",
    "current_settings": "jaxserve.quant.matmul",
    "kernel_for": "jaxserve.quant.matmul",
    "dequantize_params": "jaxserve.quant.params",
    "is_quantized": "jaxserve.quant.params",
    "kernel_plan": "jaxserve.quant.params",
    "matmul_context": "jaxserve.quant.matmul",
    "quantization_report": "jaxserve.quant.params",
    "quantize_params": "jaxserve.quant.params",
    "quantized_shapes": "jaxserve.quant.params",
    "quantized_apply": "jaxserve.quant.matmul",
    "quantized_matmul": "jaxserve.quant.matmul",
    "use_quantized_matmul": "jaxserve.quant.matmul",
    "weight_bytes": "jaxserve.quant.params",
})

if TYPE_CHECKING:
    from jaxserve.quant.matmul import (IMPLS, MatmulSettings, current_settings, kernel_for, matmul_context,
                                       quantized_apply, quantized_matmul, use_quantized_matmul)
    from jaxserve.quant.params import (DEFAULT_EXCLUDE, QuantizationReport, dequantize_params, is_quantized,
                                       kernel_plan, quantization_report, quantize_params, quantized_shapes,
                                       weight_bytes)
