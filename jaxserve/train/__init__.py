"""Training the zoo models: corpus snapshot, tokenizer, optax loop with resumable orbax checkpoints."""
from jaxserve.train.config import DataConfig, TrainConfig, TrainRunConfig, parse_run_config
from jaxserve.train.trainer import train

__all__ = ["DataConfig", "TrainConfig", "TrainRunConfig", "parse_run_config", "train"]
