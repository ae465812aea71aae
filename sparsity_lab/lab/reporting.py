"""``--report-to tensorboard wandb``: every logged row of a run also goes to TensorBoard and/or Weights & Biases.

The scalars are the log's own columns (``runlog.py``), under the same names, at the row's optimizer step:
loss, val_loss, lr, grad_norm, flip_rate and flip/<layer>, beta, density, dense_phase (1 while the layers
run dense, else 0), tokens_per_s, and the activation statistics of a relu2 model. Null entries (no
evaluation at that step, no mask computed) are skipped, not written as a made-up number.

    tensorboard   torch.utils.tensorboard, event files in OUT/tensorboard (``tensorboard --logdir OUT``);
                  needs the tensorboard package: pip install "sparsity-lab[tensorboard]"
    wandb         one W&B run, offline unless WANDB_MODE says otherwise (files in OUT/wandb; upload later
                  with ``wandb sync``); needs the wandb package: pip install "sparsity-lab[wandb]"

Both are optional: ``check_report_to`` refuses a missing one before any work, naming the extra to install.
"""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path

REPORT_TO = ("none", "tensorboard", "wandb")
EXTRAS = {"tensorboard": "tensorboard", "wandb": "wandb"}  # reporter -> (package, the extra that installs it)


def add_report_argument(parser) -> None:
    parser.add_argument("--report-to", nargs="+", choices=REPORT_TO, default=["none"],
                        metavar="{tensorboard,wandb,none}",
                        help="also send the logged rows (loss, lr, flip rate, dense phase, ...) to TensorBoard "
                             "(OUT/tensorboard) and/or Weights & Biases (offline unless WANDB_MODE is set; OUT/wandb); "
                             "default none")


def targets(report_to) -> list[str]:
    names = [n for n in (report_to or []) if n != "none"]
    if "none" in (report_to or []) and names:
        raise ValueError(f"--report-to none goes alone, got {' '.join(report_to)}")
    return list(dict.fromkeys(names))


def check_report_to(report_to) -> None:
    """ValueError, before any work, for a reporter whose package is not installed."""
    for name in targets(report_to):
        if importlib.util.find_spec(EXTRAS[name]) is None:
            raise ValueError(f"--report-to {name} needs the {EXTRAS[name]} package, which is not installed: "
                             f"pip install \"sparsity-lab[{name}]\" (or pip install {EXTRAS[name]})")


def scalars(row: dict) -> dict[str, float]:
    """The row's numbers by log column (step and tokens are the x axis; null entries left out)."""
    out = {}
    for key, value in row.items():
        if key in ("step", "tokens") or value is None:
            continue
        if isinstance(value, bool):
            out[key] = float(value)
        elif isinstance(value, (int, float)):
            out[key] = float(value)
    return out


class TensorBoardReporter:
    """Scalars to event files in ``log_dir`` (one folder per run)."""

    def __init__(self, log_dir: str | Path) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as err:
            raise ValueError(f"--report-to tensorboard: {err}; pip install \"sparsity-lab[tensorboard]\"") from None
        self.log_dir = Path(log_dir)
        self.writer = SummaryWriter(log_dir=str(self.log_dir))

    def log(self, row: dict) -> None:
        for key, value in scalars(row).items():
            self.writer.add_scalar(key, value, global_step=row["step"])

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbReporter:
    """One W&B run; offline unless the environment's WANDB_MODE asks for another mode."""

    def __init__(self, folder: str | Path, name: str, config: dict, group: str | None = None) -> None:
        import wandb

        self.mode = os.environ.get("WANDB_MODE", "offline")
        Path(folder).mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", "sparsity-lab"), name=name, group=group,
                              dir=str(folder), mode=self.mode, config=config)

    def log(self, row: dict) -> None:
        self.run.log(scalars(row), step=row["step"])

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.run.finish()


def reporters_for(report_to, folder: str | Path, name: str, config: dict, group: str | None = None) -> list:
    """The reporters ``report_to`` names, writing under ``folder``."""
    out = []
    for target in targets(report_to):
        if target == "tensorboard":
            out.append(TensorBoardReporter(Path(folder) / "tensorboard"))
        elif target == "wandb":
            out.append(WandbReporter(folder, name, config, group))
    return out


class ReportingLog:
    """A run log (``runlog.RunLog``) that also hands every row to reporters."""

    def __init__(self, log, reporters: list) -> None:
        self.log, self.reporters = log, reporters
        self.path = log.path

    def write(self, row: dict) -> None:
        self.log.write(row)
        for reporter in self.reporters:
            reporter.log(row)

    def truncate_after(self, step: int) -> None:
        self.log.truncate_after(step)

    def flush(self) -> None:
        self.log.flush()
        for reporter in self.reporters:
            reporter.flush()

    def close(self) -> None:
        self.log.close()
        for reporter in self.reporters:
            reporter.close()
        self.reporters = []


def attach_reporters(trainer, reporters: list) -> None:
    """Send the trainer's logged rows to ``reporters`` too (closed with the trainer)."""
    if reporters:
        trainer.log = ReportingLog(trainer.log, reporters)
