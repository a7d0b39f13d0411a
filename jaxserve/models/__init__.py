"""Pure-functional Flax models (Llama / Qwen2 / Qwen3), presets, and Hugging Face import."""
from typing import TYPE_CHECKING

from jaxserve.lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "AttentionMetadata": "jaxserve.models.attention",
    "PRESETS": "jaxserve.models.presets",
    "Transformer": "jaxserve.models.transformer",
    "forward": "jaxserve.models.transformer",
    "forward_full": "jaxserve.models.transformer",
    "forward_hidden": "jaxserve.models.transformer",
    "get_preset": "jaxserve.models.presets",
    "init_params": "jaxserve.models.transformer",
    "load_hf": "jaxserve.models.hf",
    "param_shapes": "jaxserve.models.transformer",
})

if TYPE_CHECKING:
    from jaxserve.models.attention import AttentionMetadata
    from jaxserve.models.hf import load_hf
    from jaxserve.models.presets import PRESETS, get_preset
    from jaxserve.models.transformer import (Transformer, forward, forward_full, forward_hidden, init_params,
                                              param_shapes)
