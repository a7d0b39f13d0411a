"""Training the zoo models: corpus snapshot, tokenizer, optax loop with resumable orbax checkpoints."""
from typing import TYPE_CHECKING

from jaxserve.lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "DataConfig": "jaxserve.train.config",
    "TrainConfig": "jaxserve.train.config",
    "TrainRunConfig": "jaxserve.train.config",
    "parse_run_config": "jaxserve.train.config",
    "train": "jaxserve.train.trainer",
})

if TYPE_CHECKING:
    from jaxserve.train.config import DataConfig, TrainConfig, TrainRunConfig, parse_run_config
    from jaxserve.train.trainer import train
