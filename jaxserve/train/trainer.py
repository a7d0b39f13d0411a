"""The training loop: data, mesh, optimizer, checkpoints, metrics, and the final model export.

``train(run_config)`` trains (resuming from ``out_dir/checkpoints`` when present) and writes
``out_dir/final`` as a jaxserve checkpoint with ``tokenizer.json`` beside it (and, for an MoE
model, ``router_state.json``: its loss-free balancing biases), ``metrics.jsonl`` and
``training_curve.png``.
"""
from __future__ import annotations

import dataclasses
import json
import pathlib
import shutil
import sys
import time

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from tqdm import tqdm

from jaxserve.models.checkpoint import load_config, load_model, save_model, write_manifest
from jaxserve.models import init_params, param_shapes
from jaxserve.moe.balancing import init_router_state
from jaxserve.moe.router_state_file import save_router_state
from jaxserve.train.moe import evaluate_balance
from jaxserve.tokenizer import TOKENIZER_FILE, Tokenizer, load_tokenizer
from jaxserve.train import state as ckpt
from jaxserve.speculative.token_counts import write_counts
from jaxserve.train.config import TrainRunConfig
from jaxserve.train.data import BatchOrder, encode_split, windows
from jaxserve.train.loss_focus import answer_mask, assistant_marker, head_vocab, target_counts
from jaxserve.train.metrics import MetricsLog, plot_curve
from jaxserve.train.step import evaluate, make_optimizer, make_train_step, optimizer_fields
from jaxserve.train.tokenizer import train_tokenizer


def data_mesh() -> Mesh:
    """A 1-D mesh over all devices, axis "data" (batch-parallel)."""
    return jax.make_mesh((jax.device_count(),), ("data",), axis_types=(jax.sharding.AxisType.Auto,))


def prepare_tokenizer(rc: TrainRunConfig, out_dir: pathlib.Path) -> Tokenizer:
    """The run's tokenizer: ``data.tokenizer`` if given, else the one saved in out_dir, else a new one.

    It is checked against ``model.vocab_size`` before anything is written; then saved in out_dir.
    """
    saved = out_dir / TOKENIZER_FILE
    if rc.data.tokenizer:
        tok = load_tokenizer(rc.data.tokenizer)
    elif saved.exists():
        tok = load_tokenizer(saved)
    else:
        tok = Tokenizer(train_tokenizer(rc.data.corpus or None, rc.model.vocab_size))
    if tok.vocab_size != rc.model.vocab_size:
        raise ValueError(f"tokenizer has {tok.vocab_size} tokens but model.vocab_size={rc.model.vocab_size}")
    out_dir.mkdir(parents=True, exist_ok=True)
    if not saved.exists():
        tok.save(out_dir)
    return tok


def train(rc: TrainRunConfig, *, stop_after: int | None = None, progress: bool = True) -> dict:
    """Trains to ``rc.train.steps`` (or stops after step ``stop_after``, as an interruption would).

    Returns ``{"step", "params", "router_state", "final_eval", "out_dir"}``. Raises FileNotFoundError for a missing
    corpus or tokenizer and ValueError for inconsistent settings, before any state is written.
    """
    tc, out_dir = rc.train, pathlib.Path(rc.train.out_dir)
    _check_inputs(rc)
    mesh = data_mesh()
    if (tc.batch_size // tc.grad_accum) % mesh.size:
        raise ValueError(f"micro-batch {tc.batch_size // tc.grad_accum} is not divisible by {mesh.size} devices")
    tok = prepare_tokenizer(rc, out_dir)
    rc = dataclasses.replace(rc, model=dataclasses.replace(rc.model, eos_token_id=tok.eos_token_id))
    (out_dir / "run_config.json").write_text(json.dumps(dataclasses.asdict(rc), indent=2))
    train_w = load_windows(rc) if rc.data.train_windows else windows(
        encode_split(tok, rc.data.corpus, "train", rc.data.max_train_tokens), rc.data.seq_len)
    val_w = windows(encode_split(tok, rc.data.corpus, "val", rc.data.max_val_tokens), rc.data.seq_len)
    val_w = val_w[:tc.eval_windows] if tc.eval_windows else val_w
    mask, counts = _loss_focus(rc, tok, train_w)

    mngr = ckpt.manager(out_dir, tc.keep_checkpoints)
    start, params, opt_state, router_state = _init_or_restore(rc, mesh, mngr)
    end = min(tc.steps, stop_after if stop_after is not None else tc.steps)
    params, router_state = _run_steps(rc, mesh, mngr, params, opt_state, router_state, (train_w, mask, counts),
                                      val_w, start, end, progress)
    mngr.close()
    result = {"step": max(start, end), "params": params, "router_state": router_state, "out_dir": out_dir,
              "final_eval": None}
    if result["step"] >= tc.steps:
        result["final_eval"] = _export(out_dir, rc.model, params, router_state, counts)
    return result


def _loss_focus(rc: TrainRunConfig, tok: Tokenizer, train_w: np.ndarray):
    """``(mask bool[W, L] or None, counts i64[V] or None)``: the answer tokens of ``train_w`` (``loss_on``) and
    how often each token is a counted target (for ``head_vocab_size``)."""
    tc = rc.train
    if tc.loss_on == "all" and not tc.head_vocab_size:
        return None, None
    mask = answer_mask(train_w, assistant_marker(tok), tok.eos_token_id) if tc.loss_on == "answers" else None
    counts = target_counts(train_w, mask, rc.model.vocab_size) if tc.head_vocab_size else None
    return mask, counts


def _init_or_restore(rc: TrainRunConfig, mesh: Mesh, mngr):
    """``(step, params, opt_state, router_state)``: fresh (from the seed, or ``init_from``'s params), or the
    newest checkpoint. ``router_state`` is ``{}`` for a dense model, zero biases for a fresh MoE one."""
    tc = rc.train
    init = load_model(tc.init_from)[1] if tc.init_from else init_params(rc.model, jax.random.key(tc.seed))
    init = jax.tree.map(lambda p: p.astype(jax.numpy.float32), init)  # zoo checkpoints are stored in bf16
    params = jax.device_put(init, NamedSharding(mesh, P()))
    opt_state = make_optimizer(tc)[0].init(params)
    router_state = init_router_state(rc.model) if rc.model.num_experts else {}
    restored = ckpt.restore_latest(mngr, params, opt_state, router_state)
    if restored is None:
        return 0, params, opt_state, router_state
    step, params, opt_state, position, router_state = restored
    if position != step * tc.batch_size:
        raise ValueError(f"checkpoint at step {step} consumed {position} sequences, expected "
                         f"{step * tc.batch_size}: was batch_size changed between runs?")
    return step, params, opt_state, router_state


def _run_steps(rc, mesh, mngr, params, opt_state, router_state, train_data, val_w, start: int, end: int,
               progress: bool):
    """Steps ``start .. end-1``: train, log every log_every, evaluate every eval_every, checkpoint. ``train_data``:
    ``(windows, answer mask or None, target counts or None)`` (``_loss_focus``)."""
    tc, out_dir = rc.train, pathlib.Path(rc.train.out_dir)
    train_w, mask, counts = train_data
    head = head_vocab(counts, tc.head_vocab_size) if counts is not None else None
    log, order = MetricsLog(out_dir, start), BatchOrder(len(train_w), tc.batch_size, tc.seed)
    teacher_config, teacher_params = _load_teacher(tc.distill_from, mesh)
    step_fn = make_train_step(rc.model, optimizer_fields(tc), teacher_config)
    schedule = make_optimizer(tc)[1]
    batch_sharding = NamedSharding(mesh, P(None, "data"))  # i32[A, B, L]: sequences split over devices
    t0, elapsed = time.perf_counter(), lambda: log.elapsed_offset + time.perf_counter() - t0
    bar = tqdm(range(start, end), initial=start, total=tc.steps, disable=not progress, file=sys.stderr,
               mininterval=1.0 if sys.stderr.isatty() else 30.0, desc=out_dir.name)
    for step in bar:
        rows = order.indices(step)
        batch = train_w[rows].reshape(tc.grad_accum, -1, rc.data.seq_len + 1)
        batch_mask = None if mask is None else jax.device_put(mask[rows].reshape(batch.shape), batch_sharding)
        params, router_state, opt_state, m = step_fn(params, router_state, opt_state,
                                                     jax.device_put(batch, batch_sharding), teacher_params,
                                                     batch_mask, head)
        done = step + 1
        if done % tc.log_every == 0 or done == end:
            bar.set_postfix(loss=f"{float(m['loss']):.3f}")
            log.write({"step": done, "loss": float(m["loss"]), "grad_norm": float(m["grad_norm"]),
                       "lr": float(schedule(step)), "tokens": done * tc.batch_size * rc.data.seq_len,
                       "elapsed_s": elapsed(), **{k: float(m[k]) for k in ("kl", "max_vio") if k in m}})
        if done % tc.eval_every == 0 or done == tc.steps:
            log.write({"step": done, **_validate(params, router_state, rc.model, val_w), "elapsed_s": elapsed()})
        if done % tc.checkpoint_every == 0 or done == end:
            ckpt.save_state(mngr, done, params, opt_state, done * tc.batch_size, router_state)
    bar.close()
    return params, router_state


def _load_teacher(path: str, mesh: Mesh):
    """``(config, float32 params replicated over the mesh)`` of the distillation teacher, or (None, None)."""
    if not path:
        return None, None
    config, params = load_model(path)
    params = jax.tree.map(lambda p: p.astype(jax.numpy.float32), params)
    return dataclasses.replace(config, dtype="float32"), jax.device_put(params, NamedSharding(mesh, P()))


def _validate(params, router_state, config, val_w) -> dict:
    """Validation loss/perplexity; for an MoE model also MaxVio_global (loads summed over val_w)."""
    out = evaluate(params, config, val_w, router_state=router_state)
    if router_state:
        batch = min(8, len(val_w))
        out["max_vio_global"] = evaluate_balance(params, router_state, config, val_w, batch)["max_vio_global"]
    return out


def load_windows(rc: TrainRunConfig) -> np.ndarray:
    """``data.train_windows`` (one .npy, or several joined by commas, concatenated) as i32[W, seq_len + 1],
    checked against the run's seq_len and vocabulary."""
    return np.concatenate([_load_window_file(rc, path) for path in rc.data.train_windows.split(",")])


def _load_window_file(rc: TrainRunConfig, path: str) -> np.ndarray:
    if not pathlib.Path(path).is_file():
        raise FileNotFoundError(f"data.train_windows file {path} does not exist")
    try:
        w = np.load(path)
    except (ValueError, OSError) as e:  # not an .npy file, or pickled objects (refused)
        raise ValueError(f"data.train_windows={path} is not a readable .npy array: {e}") from None
    if w.ndim != 2 or w.shape[1] != rc.data.seq_len + 1 or len(w) < 1 or not np.issubdtype(w.dtype, np.integer):
        raise ValueError(f"data.train_windows={path} must hold integer windows [W, seq_len + 1 = "
                         f"{rc.data.seq_len + 1}], got {w.dtype}{list(w.shape)}")
    if w.min() < 0 or w.max() >= rc.model.vocab_size:
        raise ValueError(f"data.train_windows={path} has token ids {w.min()}..{w.max()} outside "
                         f"[0, {rc.model.vocab_size})")
    return w.astype(np.int32)


def _check_inputs(rc: TrainRunConfig) -> None:
    if rc.data.train_windows:
        load_windows(rc)
    if rc.data.corpus and not pathlib.Path(rc.data.corpus).is_file():
        raise FileNotFoundError(f"corpus file {rc.data.corpus} does not exist")
    if rc.data.tokenizer and not pathlib.Path(rc.data.tokenizer).exists():
        raise FileNotFoundError(f"tokenizer {rc.data.tokenizer} does not exist")
    focused = rc.train.loss_on != "all" or rc.train.head_vocab_size
    if focused and (rc.train.distill_from or rc.model.num_experts):
        raise ValueError("train.loss_on / train.head_vocab_size are for a dense draft's cross-entropy: not with "
                         "train.distill_from or an MoE model")
    if rc.train.loss_on == "answers":
        if not rc.data.tokenizer:
            raise ValueError("train.loss_on='answers' needs data.tokenizer: a chat tokenizer's directory")
        assistant_marker(load_tokenizer(rc.data.tokenizer))  # raises unless it has a chat template
    if rc.train.head_vocab_size > rc.model.vocab_size:
        raise ValueError(f"train.head_vocab_size={rc.train.head_vocab_size} exceeds model.vocab_size="
                         f"{rc.model.vocab_size}")
    if rc.train.distill_from:
        teacher = load_config(rc.train.distill_from)  # raises CheckpointError if it is not a checkpoint
        if teacher.vocab_size != rc.model.vocab_size:
            raise ValueError(f"train.distill_from={rc.train.distill_from} has vocab_size {teacher.vocab_size}, "
                             f"the model {rc.model.vocab_size}")
        if rc.model.num_experts:
            raise ValueError("train.distill_from is not supported for MoE models")
    if rc.train.init_from:
        init_config = load_config(rc.train.init_from)  # raises CheckpointError if it is not a checkpoint
        if param_shapes(init_config) != param_shapes(rc.model):
            raise ValueError(f"train.init_from={rc.train.init_from} has a different architecture than the model "
                             f"being trained")


def _export(out_dir: pathlib.Path, mc, params, router_state: dict, counts: np.ndarray | None = None) -> dict:
    """Writes ``out_dir/final`` (jaxserve checkpoint + tokenizer.json [+ router_state.json] [+ token_counts.json])
    and the curve PNG."""
    final = out_dir / "final"
    if final.exists():
        shutil.rmtree(final)
    save_model(final, mc, jax.device_get(params))
    if router_state:
        save_router_state(final, router_state)
    if counts is not None:  # the head_vocab_size tokens the draft trained on: SpeculativeConfig.draft_vocab_size
        write_counts(final, counts, "the counted targets of the training windows")
    shutil.copy(out_dir / TOKENIZER_FILE, final / TOKENIZER_FILE)
    write_manifest(final)  # now covering the tokenizer and router state too
    plot_curve(out_dir / "metrics.jsonl", out_dir / "training_curve.png", title=out_dir.name)
    rows = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    return next((r for r in reversed(rows) if "val_loss" in r), None)
