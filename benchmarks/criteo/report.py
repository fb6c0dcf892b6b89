"""What the Criteo job leaves behind: a progress line, a metrics file (JSON lines) and a plot.

metrics.jsonl holds one object per line, each with "kind":
  "config"  the arguments and the run's description (first line)
  "train"   step, loss (mean since the last record), samples_per_sec (over that span), elapsed_s
  "eval"    step, auc, loss, rows
  "summary" the final result (throughput, losses, AUC, times)
"""

import json
import os
import time


class MetricsLog:
    """Appends JSON lines to `path` (rank 0 only; None writes nothing)."""

    def __init__(self, path):
        self.path = path
        if path:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            self._f = open(path, "w")

    def write(self, kind, **fields):
        if self.path:
            self._f.write(json.dumps({"kind": kind, **fields}, sort_keys=True) + "\n")
            self._f.flush()

    def close(self):
        if self.path:
            self._f.close()


def read_metrics(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


class Progress:
    """Samples/s over the last span and an ETA from the mean step time so far (evaluation time
    left out, since it is not training)."""

    def __init__(self, total_steps, global_batch):
        self.total, self.batch = total_steps, global_batch
        self.t0 = self._t_last = time.time()
        self._step_last = 0
        self.paused_s = self._paused_mark = 0.0

    def pause(self, seconds):
        self.paused_s += seconds

    def update(self, step):
        """(samples/s since the last update, ETA in seconds, training seconds so far)."""
        now = time.time()
        span = now - self._t_last - (self.paused_s - self._paused_mark)
        rate = (step - self._step_last) * self.batch / span if span > 0 else float("nan")
        train_s = now - self.t0 - self.paused_s
        eta = train_s / step * (self.total - step) if step else float("nan")
        self._t_last, self._step_last, self._paused_mark = now, step, self.paused_s
        return rate, eta, train_s


def format_eta(seconds):
    if seconds != seconds:  # NaN
        return "?"
    seconds = int(round(seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def plot(metrics_path, png_path, title="Criteo DLRM on SOK"):
    """Loss (train) and AUC (eval) over steps, two panels, to `png_path`."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on servers
    import matplotlib.pyplot as plt

    records = read_metrics(metrics_path)
    train = [r for r in records if r["kind"] == "train"]
    evals = [r for r in records if r["kind"] == "eval"]
    fig, (ax_loss, ax_auc) = plt.subplots(1, 2, figsize=(10, 3.6))
    ax_loss.plot([r["step"] for r in train], [r["loss"] for r in train], color="tab:blue")
    ax_loss.set_xlabel("step")
    ax_loss.set_ylabel("training loss (log loss)")
    ax_loss.grid(alpha=0.3)
    ax_auc.plot([r["step"] for r in evals], [r["auc"] for r in evals], "o-", color="tab:green")
    ax_auc.set_xlabel("step")
    ax_auc.set_ylabel("evaluation AUC")
    ax_auc.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(png_path)), exist_ok=True)
    fig.savefig(png_path, dpi=100)
    plt.close(fig)
    return png_path
