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


# the CLI's smallest run on the CPU, and a corpus file for it
CLI_TINY = ["--layers", "1", "--heads", "2", "--width", "16", "--context", "16", "--batch-size", "4",
            "--eval-batches", "1", "--no-progress", "--device", "cpu"]


def tiny_corpus_file(folder) -> str:
    """A small Python-like text corpus written to folder/corpus.txt; returns its path."""
    path = folder / "corpus.txt"
    path.write_text("def f(x):\n    return x * 2\n" * 400)
    return str(path)


def cli_code(argv) -> int:
    """``sparsity_lab.cli.main(argv)``'s exit status, also when argparse refuses the command line
    (SystemExit: the usage and the error, status 2)."""
    from sparsity_lab.lab.cli import main

    try:
        return main(argv)
    except SystemExit as exit_:
        return exit_.code


def exit_status(main, argv) -> int:
    """``main(argv)``'s exit status for any command-line ``main`` (argparse's refusals raise SystemExit(2))."""
    try:
        return main(argv)
    except SystemExit as exit_:
        return exit_.code
