"""jaxserve: a JAX/Pallas research framework for serving LLMs.

Public API (mirrors vLLM's offline API)::

    from jaxserve import LLM, SamplingParams
    llm = LLM(model="jaxserve/tiny-code")
    outs = llm.generate(["def fibonacci(n):"], SamplingParams(max_tokens=64, temperature=0))

The names load lazily (``jaxserve/lazy.py``): importing a host module such as
``jaxserve.engine.scheduler`` does not import JAX.
"""
from typing import TYPE_CHECKING

from jaxserve.host_malloc import retain_freed_memory
from jaxserve.lazy import lazy_exports

retain_freed_memory()  # before JAX starts its threads: XLA:CPU's scratch buffers reused, not re-faulted

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "BeamSearchParams": "jaxserve.sampling_params",
    "CompletionOutput": "jaxserve.engine.outputs",
    "EngineConfig": "jaxserve.config",
    "LLM": "jaxserve.engine.llm",
    "LLMEngine": "jaxserve.engine.llm_engine",
    "ModelConfig": "jaxserve.config",
    "RequestOutput": "jaxserve.engine.outputs",
    "SamplingParams": "jaxserve.sampling_params",
    "SpeculativeConfig": "jaxserve.speculative.config",
})

if TYPE_CHECKING:
    from jaxserve.config import EngineConfig, ModelConfig
    from jaxserve.engine.llm import LLM
    from jaxserve.engine.llm_engine import LLMEngine
    from jaxserve.engine.outputs import CompletionOutput, RequestOutput
    from jaxserve.sampling_params import BeamSearchParams, SamplingParams
    from jaxserve.speculative.config import SpeculativeConfig
