"""The roofline's predicted decode step against jaxserve's measured one, on this machine's device.

The device's ceilings are measured first (read and in-place update bandwidth, square-matmul FLOP/s in the
model's dtype); the roofline with those ceilings (and, on an H100/H200, with the datasheet's)
predicts each step; the ratio measured / predicted says how far jaxserve's step is from the
roofline (1 = at it; above 1 = slower than the model says).
"""
from __future__ import annotations

import dataclasses
import itertools
import os

import jax
import numpy as np

from experiments.blackwell_roofline.measure import device_ceilings, time_decode_step
from experiments.blackwell_roofline import perfmodel as pm
from jaxserve.models import get_preset, init_params

_FORMATS = {"float32": "fp32", "bfloat16": "bf16"}


def check_device(cfg) -> None:
    """Refuses a validation device that JAX does not run on (called before any work)."""
    backend = jax.default_backend()
    if cfg.device not in ("none", backend):
        raise ValueError(f"device={cfg.device!r} but JAX's default backend is {backend!r}")


def validate(cfg, out) -> None:
    config = get_preset(cfg.val_model)
    if cfg.val_num_layers:
        config = config.replace(num_layers=cfg.val_num_layers)
    if config.dtype not in _FORMATS:
        raise ValueError(f"val_model {cfg.val_model!r} has dtype {config.dtype}; modelled: {sorted(_FORMATS)}")
    fmt = _FORMATS[config.dtype]

    load_before = os.getloadavg()[0]
    ceil = device_ceilings(cfg.bw_bytes, cfg.matmul_n, config.dtype, cfg.val_iters)
    measured = pm.Hardware(f"measured {ceil['device']}", memory_bytes=ceil["memory_bytes"], mem_bw=ceil["read_bw"],
                           link_bw=0.0, **{f"{fmt}_flops": ceil["matmul_flops"]})
    profiles = {"read": measured, "update": dataclasses.replace(measured, mem_bw=ceil["update_bw"])}
    spec = next((hw for hw in pm.HARDWARE.values() if hw.name.split()[0] in ceil["device"]), None)
    if spec is not None:
        profiles["spec"] = spec

    profile = pm.ModelProfile.from_config(config, cfg.val_model)
    prec = pm.Precision(fmt, fmt, fmt)
    params = jax.jit(init_params, static_argnums=0)(config, jax.random.key(cfg.seed))  # one program, not ~60 op by op
    rows = []
    for ctx, b in out.progress(list(itertools.product(cfg.val_contexts, cfg.val_batches)), desc="decode steps"):
        seconds = time_decode_step(config, params, b, ctx, cfg.val_iters, attention_impl=cfg.val_attention)
        row = {"context": ctx, "batch": b, "measured_ms": seconds * 1e3}
        for label, hw in profiles.items():
            e = pm.decode_step(profile, hw, prec, b, ctx)
            row.update({f"pred_{label}_ms": e.step_s * 1e3, f"ratio_{label}": seconds / e.step_s})
            if label == "read":
                row.update(mb_read=(e.weight_bytes + e.kv_bytes) / 1e6, mflop=e.flops / 1e6, bound=e.bound)
        rows.append(row)
    load_after = os.getloadavg()[0]
    _report(cfg, out, config, ceil, profiles, rows, (load_before, load_after))


def _report(cfg, out, config, ceil, profiles, rows, loads) -> None:
    out.text(f"## Validation on this machine ({ceil['device']})\n\n"
             f"jaxserve's decode step (`ModelRunner.execute`, attention_impl={cfg.val_attention}, host packing "
             f"and result transfer included) on `{cfg.val_model}` with random weights ({config.num_layers} layers, "
             f"{config.dtype}), median of {cfg.val_iters}, against the roofline with this device's measured "
             f"ceilings; the read bandwidth is the memory roof (decode reads weights and KV and writes little). "
             f"1-minute load average {loads[0]:.2f} before, {loads[1]:.2f} after.")
    out.table("ceilings", [{**ceil, "load_before": loads[0], "load_after": loads[1]}],
              {"device": "device", "read_bw": "read GB/s (sum)", "update_bw": "in-place update GB/s (read+write)",
               "matmul_flops": "matmul GFLOP/s", "matmul_dtype": "dtype", "matmul_n": "n", "nbytes": "array MiB"},
              title="Measured ceilings", fmt={"update_bw": lambda r: f"{r['update_bw'] / 1e9:.1f}",
                                              "read_bw": lambda r: f"{r['read_bw'] / 1e9:.1f}",
                                              "matmul_flops": lambda r: f"{r['matmul_flops'] / 1e9:.1f}",
                                              "nbytes": lambda r: f"{r['nbytes'] / 2 ** 20:.0f}"})
    columns = {"context": "context", "batch": "batch", "mb_read": "MB read", "mflop": "MFLOP",
               "measured_ms": "measured ms"}
    for label in profiles:
        columns.update({f"pred_{label}_ms": f"predicted ms ({label})", f"ratio_{label}": f"measured/pred ({label})"})
    columns["bound"] = "bound"
    fmt = {k: ".3f" for k in columns if k.startswith(("pred_", "measured"))}
    fmt.update({k: ".2f" for k in columns if k.startswith("ratio_")}, mb_read=".1f", mflop=".0f")
    out.table("validation", rows, columns, fmt=fmt,
              title="Decode step: measured vs roofline (read: with the measured read bandwidth; update: with "
                    "the in-place update bandwidth; spec: the datasheet profile, on a matching GPU)")
    _fit(out, rows)
    with out.figure("validation", "Measured decode step (points) vs the roofline with the measured read bandwidth "
                    "(lines), per context length.") as ax:
        for i, ctx in enumerate(cfg.val_contexts):
            sel = [r for r in rows if r["context"] == ctx]
            ax.plot([r["batch"] for r in sel], [r["measured_ms"] for r in sel], "o", color=f"C{i}",
                    label=f"measured, context {ctx}")
            ax.plot([r["batch"] for r in sel], [r["pred_read_ms"] for r in sel], "-", color=f"C{i}",
                    label=f"roofline, context {ctx}")
        ax.set(xscale="log", yscale="log", xlabel="batch (sequences)", ylabel="decode step (ms)")
        ax.legend(fontsize=7)


def _fit(out, rows) -> None:
    """Least squares measured = overhead + slope x predicted: the fixed per-step cost the roofline
    leaves out, and how many times the roofline's bandwidth/FLOP time the rest takes."""
    pred = np.array([r["pred_read_ms"] for r in rows])
    if len(set(pred.round(6))) < 3:
        return
    slope, overhead = np.polyfit(pred, [r["measured_ms"] for r in rows], 1)
    out.json("fit", {"overhead_ms": overhead, "slope": slope})
    out.text(f"Least-squares fit over these rows: measured = {overhead:.2f} ms + {slope:.2f} x predicted (read).")
