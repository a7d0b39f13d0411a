"""Frozen configs validate themselves; dotted overrides are type-checked."""
import dataclasses

import pytest

from jaxserve.config import EngineConfig, ModelConfig, apply_overrides, engine_kwargs


@dataclasses.dataclass(frozen=True)
class Run:
    model: ModelConfig = ModelConfig()
    engine: EngineConfig = EngineConfig()


def test_nested_overrides_apply_and_keep_types():
    run = apply_overrides(Run(), ["model.num_layers=3", "engine.block_size=32", "model.rope_theta=5e5",
                                  "engine.num_kv_blocks=100", "model.tie_word_embeddings=true"])
    assert isinstance(run.model, ModelConfig) and isinstance(run.engine, EngineConfig)
    assert (run.model.num_layers, run.engine.block_size, run.model.rope_theta) == (3, 32, 5e5)
    assert run.engine.num_kv_blocks == 100 and run.model.tie_word_embeddings is True
    assert Run().model.num_layers == 4  # the original is untouched


@pytest.mark.parametrize("override, message", [
    ("model.num_layerz=3", "Key 'num_layerz' not in 'ModelConfig'"),
    ("engine.block_size=big", "engine.block_size=big"),
    ("model.num_heads=3", "num_heads=3 must be a multiple of num_kv_heads=4"),
    ("engine.attention_impl=triton", "attention_impl must be one of"),
    ("model.dtype=float8", "dtype must be one of"),
    ("no_equals_sign", "not of the form key=value"),
])
def test_bad_overrides_are_clear_errors(override, message):
    with pytest.raises(ValueError, match=message.replace(".", r"\.")):
        apply_overrides(Run(), [override])


def test_configs_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        ModelConfig().num_layers = 2


@pytest.mark.parametrize("field, value", [("hidden_size", 0), ("num_kv_heads", -1), ("head_dim", 7)])
def test_invalid_model_config(field, value):
    with pytest.raises(ValueError, match=field):
        ModelConfig(**{field: value})


def test_engine_kwargs_are_every_engine_field_with_the_overrides_applied():
    kwargs = engine_kwargs(["engine.block_size=32", "engine.enable_prefix_caching=false"])
    assert EngineConfig(**kwargs) == EngineConfig(block_size=32, enable_prefix_caching=False)
    assert set(kwargs) == {f.name for f in dataclasses.fields(EngineConfig)}
    with pytest.raises(ValueError, match="model.num_layers=2"):  # only the engine namespace exists here
        engine_kwargs(["model.num_layers=2"])
