"""An MoE model's router state (loss-free balancing selection biases) as a JSON file beside its checkpoint.

The biases are state, not parameters (``jaxserve/moe/balancing.py``), so ``jaxserve.models.checkpoint``
does not store them; a model trained with loss-free balancing keeps them in
``<checkpoint>/router_state.json`` (``{"layers_0": {"mlp": {"bias": [E floats]}}, ...}``), read back
exactly (float32 values printed with enough digits to round-trip).
"""
from __future__ import annotations

import json
import pathlib

import numpy as np

ROUTER_STATE_FILE = "router_state.json"


def save_router_state(directory: str | pathlib.Path, router_state: dict) -> pathlib.Path:
    path = pathlib.Path(directory) / ROUTER_STATE_FILE
    as_lists = {name: {"mlp": {"bias": [float(b) for b in np.asarray(layer["mlp"]["bias"], np.float32)]}}
                for name, layer in router_state.items()}
    path.write_text(json.dumps(as_lists, indent=1))
    return path


def load_router_state(directory: str | pathlib.Path) -> dict | None:
    """The router state saved beside a checkpoint, as float32 arrays; None when there is none (dense model)."""
    path = pathlib.Path(directory) / ROUTER_STATE_FILE
    if not path.is_file():
        return None
    return {name: {"mlp": {"bias": np.asarray(layer["mlp"]["bias"], np.float32)}}
            for name, layer in json.loads(path.read_text()).items()}
