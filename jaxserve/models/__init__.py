"""Pure-functional Flax models (Llama / Qwen2 / Qwen3), presets, and Hugging Face import."""
from jaxserve.models.attention import AttentionMetadata
from jaxserve.models.hf import load_hf
from jaxserve.models.presets import PRESETS, get_preset
from jaxserve.models.transformer import Transformer, forward, forward_full, init_params, param_shapes

__all__ = ["AttentionMetadata", "PRESETS", "Transformer", "forward", "forward_full", "get_preset",
           "init_params", "load_hf", "param_shapes"]
