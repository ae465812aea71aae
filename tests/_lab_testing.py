"""Helpers shared by the lab tests: a tiny run configuration and log rows without timings."""
from sparsity_lab.lab import TrainConfig


def tiny_config(default_model, **kw) -> TrainConfig:
    """A CPU run of the lab; keyword arguments (model= too) override the defaults."""
    base = dict(model=default_model, batch_size=4, steps=12, warmup_steps=2, eval_interval=4, eval_batches=2,
                device="cpu", progress=False)
    return TrainConfig(**{**base, **kw})


def without_speed(rows):
    """Logged rows minus tokens/s (the one column that is not deterministic)."""
    return [{k: v for k, v in r.items() if k != "tokens_per_s"} for r in rows]
