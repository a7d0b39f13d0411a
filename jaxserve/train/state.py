"""Train-state checkpoints with orbax ``CheckpointManager``: params, optimizer state, step, data position,
and an MoE model's router state (its loss-free balancing biases; absent for dense models).

The data position is the number of training sequences consumed (``step * batch_size``); together
with the seed it fixes the batches still to come, so a resumed run continues the same data order.
"""
from __future__ import annotations

import pathlib

import jax
import numpy as np
import orbax.checkpoint as ocp


def manager(out_dir: str | pathlib.Path, keep: int) -> ocp.CheckpointManager:
    path = pathlib.Path(out_dir).absolute() / "checkpoints"
    return ocp.CheckpointManager(path, options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True))


def save_state(mngr: ocp.CheckpointManager, step: int, params, opt_state, data_position: int,
               router_state: dict | None = None) -> None:
    state = {"params": params, "opt_state": opt_state,
             "step": np.asarray(step, np.int64), "data_position": np.asarray(data_position, np.int64)}
    if router_state:
        state["router_state"] = router_state
    mngr.save(step, args=ocp.args.StandardSave(state))
    mngr.wait_until_finished()


def restore_latest(mngr: ocp.CheckpointManager, params, opt_state, router_state: dict | None = None):
    """``(step, params, opt_state, data_position, router_state)`` from the newest checkpoint, or None.

    ``params``/``opt_state``/``router_state`` are templates (shapes, dtypes and shardings) for the
    restored arrays; ``router_state`` is restored only when the template is non-empty (MoE).
    """
    step = mngr.latest_step()
    if step is None:
        return None
    target = {"params": params, "opt_state": opt_state,
              "step": np.asarray(0, np.int64), "data_position": np.asarray(0, np.int64)}
    if router_state:
        target["router_state"] = router_state
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, target)
    state = mngr.restore(step, args=ocp.args.StandardRestore(abstract))
    return (int(state["step"]), state["params"], state["opt_state"], int(state["data_position"]),
            state.get("router_state", router_state or {}))
