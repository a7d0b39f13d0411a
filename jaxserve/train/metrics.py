"""Training metrics: a JSON-lines log (one object per row), TensorBoard when installed, and the curve plot."""
from __future__ import annotations

import json
import pathlib

METRICS_FILE = "metrics.jsonl"


class MetricsLog:
    """Appends rows to ``out_dir/metrics.jsonl``; on resume, drops rows past the restored step first."""

    def __init__(self, out_dir: str | pathlib.Path, resume_step: int = 0):
        self.path = pathlib.Path(out_dir) / METRICS_FILE
        kept = [r for r in read_metrics(self.path) if r["step"] <= resume_step] if self.path.exists() else []
        self.path.write_text("".join(json.dumps(r) + "\n" for r in kept))
        self.elapsed_offset = max((r.get("elapsed_s", 0.0) for r in kept), default=0.0)
        self._tb = _tensorboard_writer(pathlib.Path(out_dir) / "tb")

    def write(self, row: dict) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        if self._tb is not None:
            for k, v in row.items():
                if k != "step" and isinstance(v, (int, float)):
                    self._tb.add_scalar(k, v, row["step"])
            self._tb.flush()


def read_metrics(path: str | pathlib.Path) -> list[dict]:
    return [json.loads(line) for line in pathlib.Path(path).read_text().splitlines() if line.strip()]


def _tensorboard_writer(log_dir: pathlib.Path):
    for module in ("torch.utils.tensorboard", "tensorboardX"):
        try:
            return __import__(module, fromlist=["SummaryWriter"]).SummaryWriter(str(log_dir))
        except Exception:  # not installed (or broken): the JSONL log is the record
            continue
    return None


def plot_curve(metrics_path: str | pathlib.Path, out_png: str | pathlib.Path, title: str = "") -> pathlib.Path:
    """Training loss and validation loss against step, from the JSONL log, as a PNG."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(metrics_path)
    train = [(r["step"], r["loss"]) for r in rows if "loss" in r]
    val = [(r["step"], r["val_loss"]) for r in rows if "val_loss" in r]
    fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
    if train:
        ax.plot(*zip(*train), label="train loss", lw=1)
    if val:
        ax.plot(*zip(*val), "o-", label="validation loss", ms=3)
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out_png)
    plt.close(fig)
    return pathlib.Path(out_png)
