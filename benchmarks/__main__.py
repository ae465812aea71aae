"""``python -m benchmarks NAME [options]``: every benchmark of the repository, run from a clone's root.

The benchmarks are not part of the installed package: they measure it. Each writes
``results/<name>.json`` with provenance (GPU, versions, date, commit, command) under the current
directory (``--out-dir`` moves it where offered); docs/measuring.md gives the command behind every
recorded file. ``python -m benchmarks NAME --help`` shows one benchmark's options.
"""
from __future__ import annotations

import argparse
import importlib
import sys

# name -> (module, one-line help). Modules with add_arguments/run get a sub-parser; the others take
# their own arguments (main(argv)). The torchtitan recorder runs under torchtitan's own trainer:
# torchrun ... -m benchmarks.torchtitan_train --module benchmarks.torchtitan_record (docs/integrations.md).
BENCHMARKS: dict[str, tuple[str, str]] = {
    "masks": ("benchmarks.mask_solvers", "the transposable-mask solvers timed and compared (CPU)"),
    "kernels": ("benchmarks.kernels", "the Triton kernels against the copy ceiling and their baselines (GPU)"),
    "ffn": ("benchmarks.ffn.cli", "2:4 FFN and GPT step on cuSPARSELt against dense and PyTorch's path (GPU)"),
    "cslt-calls": ("benchmarks.cusparselt_calls", "one cuSPARSELt product: PyTorch's call, the direct binding, dense (GPU)"),
    "lab-speed": ("benchmarks.lab_speed", "the lab's training loop, dense against 2:4 tokens/s, eager and CUDA graph (GPU)"),
    "step-profile": ("benchmarks.step_profile", "the lab GPT's training step, dense against 2:4: breakdown, Amdahl ceilings (GPU)"),
    "step-host": ("benchmarks.step_host", "an eager lab step's host time to enqueue beside its wall time, and where it goes (GPU)"),
    "optimizer-overlap": ("benchmarks.optimizer_overlap", "the optimizer and the 2:4 weight work on two CUDA streams: how much hides (GPU)"),
    "dist": ("benchmarks.distributed_speed", "lab GPT dense against 2:4 under DDP and FSDP2 (run under torchrun; GPU)"),
    "torchtitan-gpus": ("benchmarks.torchtitan_gpus", "torchtitan's trainer, dense against 2:4, on every visible GPU (FSDP2; GPU)"),
    "compile": ("benchmarks.compile_speed", "torch.compile'd dense and 2:4 FFN and GPT training steps beside eager (GPU)"),
    "export": ("benchmarks.export_speed", "the exported lab GPT: prefill tokens/s and decode ms/token (GPU)"),
    "act24": ("benchmarks.act24_speed", "squared-ReLU FFN and GPT step with 2:4 activations (GPU)"),
    "act24-accuracy": ("benchmarks.act24_accuracy", "gelu, relu2, 2:4 activations: final losses over seeds (GPU; --device cpu small)"),
    "dyad": ("benchmarks.dyad", "DYAD layers against nn.Linear, forward + backward (GPU)"),
    "mvue-variants": ("benchmarks.mvue_variants", "the MVUE kernel's variants against the copy ceiling (GPU)"),
    "fp8-training": ("benchmarks.fp8_training", "FP8 2:4 training products and FFN step against dense FP8 and bf16 (GPU)"),
    "fp8-scale-update": ("benchmarks.fp8_scale_update", "FP8 layers' end-of-step scale updates: kernel 25 against the PyTorch operations, host time (GPU)"),
    "fp8-ffn-clocks": ("benchmarks.fp8_ffn_clocks", "the GPU's SM clock, power and clock-event reasons while each FP8 FFN step runs (GPU)"),
    "fp8-scalar-alpha": ("benchmarks.fp8_scalar_alpha", "does a scalar alpha scale an FP8 2:4 product, and what it saves (GPU)"),
    "cutlass": ("benchmarks.cutlass_sparse", "CUTLASS SM90 2:4 GEMMs (bf16, FP8) against cuBLAS and cuSPARSELt (GPU)"),
    "fp8-sparse": ("benchmarks.fp8_sparse", "one FP8 2:4 forward product against dense FP8 (GPU)"),
    "kernel-configs": ("benchmarks.kernel_configs", "launch configurations of the activation and FP8 kernels swept (GPU)"),
    "ffn-profile": ("benchmarks.ffn_profile", "torch.profiler table of one 2:4 FFN step (GPU)"),
    "act24-profile": ("benchmarks.act24_profile", "torch.profiler table of one 2:4-activation FFN step (GPU)"),
    "cusparselt-probe": ("benchmarks.cusparselt_probe", "what cuSPARSELt accepts and how fast: algorithms, scales, FP8 (GPU)"),
    "cusparselt-layout": ("benchmarks.cusparselt_layout_dump", "dump cuSPARSELt's compressed layout for known patterns (GPU)"),
}


def _has_subparser(module) -> bool:
    return hasattr(module, "add_arguments") and hasattr(module, "run")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    listing = "\n".join(f"  {name:<18} {help_text}" for name, (_, help_text) in BENCHMARKS.items())
    parser = argparse.ArgumentParser(prog="python -m benchmarks", formatter_class=argparse.RawDescriptionHelpFormatter,
                                     description="Benchmarks of sparsity-lab (run from a clone's root).",
                                     epilog="benchmarks:\n" + listing)
    parser.add_argument("name", choices=list(BENCHMARKS), metavar="NAME", help="which benchmark (listed below)")
    if not argv or argv[0] in ("-h", "--help"):
        parser.print_help()
        return 0
    args, rest = parser.parse_known_args(argv[:1])
    module_name, help_text = BENCHMARKS[args.name]
    rest = argv[1:]
    module = importlib.import_module(module_name)
    if _has_subparser(module):
        sub = argparse.ArgumentParser(prog=f"python -m benchmarks {args.name}", description=help_text)
        module.add_arguments(sub)
        parsed = sub.parse_args(rest)
        check = getattr(module, "check_arguments", None)
        if check is not None:  # options that do not go together: refused before any work (exit status 2)
            try:
                check(parsed)
            except ValueError as err:
                sub.error(str(err))
        return int(module.run(parsed) or 0)
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
