"""jaxserve: a JAX/Pallas research framework for serving LLMs.

Public API (mirrors vLLM's offline API)::

    from jaxserve import LLM, SamplingParams
    llm = LLM(model="jaxserve/tiny-code")
    outs = llm.generate(["def fibonacci(n):"], SamplingParams(max_tokens=64, temperature=0))
"""
from jaxserve.config import EngineConfig, ModelConfig
from jaxserve.engine.llm import LLM
from jaxserve.engine.llm_engine import LLMEngine
from jaxserve.engine.outputs import CompletionOutput, RequestOutput
from jaxserve.sampling_params import BeamSearchParams, SamplingParams
from jaxserve.speculative.config import SpeculativeConfig

__all__ = ["LLM", "LLMEngine", "BeamSearchParams", "CompletionOutput", "EngineConfig", "ModelConfig",
           "RequestOutput", "SamplingParams", "SpeculativeConfig"]
