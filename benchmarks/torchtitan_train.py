"""``python -m benchmarks.torchtitan_train ARGS``: the library's torchtitan launcher
(``sparsity_lab.integrations.torchtitan_train``: torchtitan 0.3's trainer on torch 2.11 and 2.13), plus,
for the smoke run, ``SPARSITY_LAB_TITAN_DEVICE=cpu``: torchtitan's device choice pointed at the CPU
(``benchmarks/torchtitan_cpu.py``) before the trainer is imported.
"""
import os

from sparsity_lab.integrations.torchtitan_train import install_compat, main as library_main


def main() -> None:
    if os.environ.get("SPARSITY_LAB_TITAN_DEVICE") == "cpu":
        from benchmarks.torchtitan_cpu import use_cpu
        use_cpu()
    library_main()


__all__ = ["install_compat", "main"]

if __name__ == "__main__":
    main()
