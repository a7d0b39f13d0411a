"""save_hf writes a directory that load_hf and transformers both read back to the same model."""
import jax
import numpy as np
import pytest

from jaxserve.models import get_preset, init_params, load_hf
from jaxserve.models.hf_export import save_hf
from tests.reference_forward import reference_logits


@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-qwen3"])
def test_export_round_trip_and_transformers_agrees(tmp_path, preset):
    config = get_preset(preset)
    params = init_params(config, jax.random.key(0))
    save_hf(tmp_path / "m", config, params)
    config2, params2 = load_hf(tmp_path / "m")
    assert config2 == config
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(params2)):
        np.testing.assert_array_equal(a, b)
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "m", dtype=torch.float32).eval()
    tokens = np.arange(1, 12)[None]
    with torch.no_grad():
        expected = model(torch.tensor(tokens)).logits.numpy()
    np.testing.assert_allclose(reference_logits(params, config, tokens), expected, atol=1e-4)
