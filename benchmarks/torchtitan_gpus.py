"""torchtitan 0.3's trainer, dense against 2:4, on every visible GPU (FSDP2): tokens/s per GPU, peak memory
and the loss of every step, into results/<name>.json with provenance.

    python -m benchmarks torchtitan-gpus                          # every visible GPU, 300 steps each
    python -m benchmarks torchtitan-gpus --device cpu --nproc 2 --dim 64 --layers 2 --heads 4 \\
        --seq-len 64 --batch 2 --vocab 512 --steps 3             # the smoke run: gloo, checks the path

Nothing is downloaded. It writes into ``--work-dir``: a text corpus of JSON lines, one document per ``.py``
file of the running Python's standard library (the lab's default corpus, ``sparsity_lab.lab.data``), and a
byte-level BPE tokenizer trained on part of it (``--vocab`` tokens, ``<|endoftext|>`` among them, after each
document). Then, for each of ``--methods``, one ``torchrun --nproc-per-node N`` job of torchtitan's trainer
(``benchmarks.torchtitan_train``) with the recorder's ``llama3_sized`` config (``benchmarks.torchtitan_record``:
``--dim``, ``--layers``, ``--heads`` through ``$SPARSITY_LAB_TITAN_MODEL``; causal SDPA attention; no
compilation; FSDP2 over all N processes, bf16 parameters, float32 reductions). 2:4 methods get
``--mvue``/``--transposable`` and ``--backend`` (cusparselt by default). Each job's log is kept beside its
record in ``--work-dir``; a job that fails or outlives ``--run-timeout`` is recorded with the end of its log,
and the next one runs. The result holds each job's command, recorder output (per step: loss,
``throughput(tps)`` per GPU, ``memory/max_reserved(GiB)``, step time, 2:4 check) and a summary: medians after
the first two steps, and each method's tokens/s against dense.
"""
from __future__ import annotations

import os

# NVLink multicast stays off on the machines this runs on (set before any process group starts)
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
os.environ.update(MULTICAST_OFF)

import argparse  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import shlex  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

from sparsity_lab.lab.arguments import backend_name, output_folder, positive_int  # noqa: E402

RESULT_PREFIX = "torchtitan_llama"
METHODS = ("dense", "ste", "srste", "masked_decay", "masked_decay_weights", "sste")
EOS = "<|endoftext|>"
BPE_SAMPLE_BYTES = 4 * 2**20  # the tokenizer is trained on about this much of the corpus (seconds, not minutes)
PROFILE_ENV = "SPARSITY_LAB_PROFILE_STEPS"  # FIRST:COUNT, read by the recorder (torchtitan_record)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cuda (default; NCCL) or cpu (gloo, the smoke run: checks the path, not a figure)")
    parser.add_argument("--nproc", type=positive_int, default=None,
                        help="processes, one per GPU (default: every visible GPU; required with --device cpu)")
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=["dense", "sste"],
                        help="default dense sste (run in this order; ratios are against dense)")
    parser.add_argument("--mvue", action=argparse.BooleanOptionalAction, default=True,
                        help="2:4 methods: MVUE weight gradient (default on)")
    parser.add_argument("--transposable", action=argparse.BooleanOptionalAction, default=True,
                        help="2:4 methods: transposable masks (default on)")
    parser.add_argument("--backend", type=backend_name, default=None,
                        help="2:4 products (default cusparselt on cuda, torch on cpu)")
    parser.add_argument("--steps", type=positive_int, default=300, help="training steps per method (default 300)")
    parser.add_argument("--dim", type=positive_int, default=4096, help="model width (default 4096)")
    parser.add_argument("--layers", type=positive_int, default=8, help="transformer blocks (default 8)")
    parser.add_argument("--heads", type=positive_int, default=32, help="attention heads (default 32)")
    parser.add_argument("--seq-len", type=positive_int, default=2048, help="tokens per sequence (default 2048)")
    parser.add_argument("--batch", type=positive_int, default=4, help="sequences per GPU per step (default 4)")
    parser.add_argument("--vocab", type=positive_int, default=8192,
                        help="BPE vocabulary, <|endoftext|> included (default 8192; at least 258)")
    parser.add_argument("--max-corpus-mb", type=positive_int, default=64,
                        help="cap on the standard-library text written (default 64)")
    parser.add_argument("--run-timeout", type=positive_int, default=240,
                        help="seconds one method's job may run before it is stopped (default 240)")
    parser.add_argument("--work-dir", type=output_folder, default="runs/torchtitan_gpus",
                        help="corpus, tokenizer, logs and the jobs' records (default runs/torchtitan_gpus)")
    parser.add_argument("--name", default=None,
                        help=f"result JSON name (default {RESULT_PREFIX}_<gpu>x<N>, e.g. {RESULT_PREFIX}_h100x4)")
    parser.add_argument("--out-dir", type=output_folder, default=None, help="folder for the JSON (default results/)")
    parser.add_argument("--profile-steps", default=None, metavar="FIRST:COUNT",
                        help="also profile steps FIRST..FIRST+COUNT-1 of each job (kernel time by kind of work, rank 0)")
    parser.add_argument("--dry-run", action="store_true", help="print the jobs' commands and stop (no data, no runs)")


def profile_window(text: str) -> tuple[int, int] | None:
    """``"FIRST:COUNT"`` (``$SPARSITY_LAB_PROFILE_STEPS``) -> (FIRST, COUNT); "" -> None."""
    if not text:
        return None
    first, sep, count = text.partition(":")
    if not sep or not first.isdigit() or not count.isdigit() or int(first) < 1 or int(count) < 1:
        raise ValueError(f"{PROFILE_ENV}: expected FIRST:COUNT, two positive integers (e.g. 50:3), got {text!r}")
    return int(first), int(count)


def check_arguments(args) -> None:
    """Options that do not go together (the runner turns a ValueError into a usage error)."""
    if args.device == "cpu" and args.nproc is None:
        raise ValueError("--device cpu needs --nproc (the number of gloo processes)")
    if args.dim % args.heads or (args.dim // args.heads) % 2:
        raise ValueError(f"--dim ({args.dim}) must be --heads ({args.heads}) times an even head size")
    if args.dim % 4:
        raise ValueError(f"--dim ({args.dim}) must be a multiple of 4: the 2:4 groups run along it")
    if args.vocab < 258:
        raise ValueError(f"--vocab must be at least 258 (the 256 bytes, a merge and {EOS}), got {args.vocab}")
    if len(set(args.methods)) != len(args.methods):
        raise ValueError(f"--methods lists a method twice: {' '.join(args.methods)}")
    if args.profile_steps is not None:
        first, count = profile_window(args.profile_steps)
        if first + count - 1 > args.steps:
            raise ValueError(f"--profile-steps {args.profile_steps} runs past --steps {args.steps}")
    if args.name is not None and not re.fullmatch(r"[A-Za-z0-9_.-]+", args.name):
        raise ValueError(f"--name must be letters, digits, '.', '_' or '-', got {args.name!r}")


def world_size(args) -> int:
    if args.nproc is not None:
        return args.nproc
    import torch

    count = torch.cuda.device_count()
    if count == 0:
        raise SystemExit("torchtitan-gpus: no CUDA GPU is visible; use --device cpu --nproc N for the smoke run")
    return count


def prepare_data(work: Path, vocab: int, max_bytes: int) -> dict:
    """The corpus (JSON lines) and the tokenizer folder under ``work``; returns what they hold."""
    from tokenizers import Tokenizer

    from sparsity_lab.lab.data import stdlib_files
    from sparsity_lab.lab.tokens import train_bpe

    root, files = stdlib_files()
    docs, total = [], 0
    for f in files:
        text = f.read_text(encoding="utf-8", errors="replace")
        if not text.strip():
            continue
        docs.append(text)
        total += len(text.encode("utf-8"))
        if total >= max_bytes:
            break
    corpus = work / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs), encoding="utf-8")
    # the tokenizer sees every k-th document (spread over the library), about BPE_SAMPLE_BYTES of them
    every = max(1, total // BPE_SAMPLE_BYTES)
    tok_dir = work / "tokenizer"
    path = train_bpe("".join(docs[::every]), vocab - 1, tok_dir / "tokenizer.json")
    tokenizer = Tokenizer.from_file(str(path))
    tokenizer.add_special_tokens([EOS])
    tokenizer.save(str(path))
    (tok_dir / "tokenizer_config.json").write_text(json.dumps({"eos_token": EOS, "add_eos_token": True}) + "\n")
    return {"source": f"python-stdlib:{root}", "documents": len(docs), "bytes": total, "corpus": str(corpus),
            "tokenizer": str(tok_dir), "tokenizer_vocab": tokenizer.get_vocab_size(with_added_tokens=True),
            "bpe_trained_on_documents": len(docs[::every])}


def model_vocab(tokenizer_vocab: int) -> int:
    """The model's vocabulary: the tokenizer's, rounded up to a multiple of 64 (rows never targeted are fine)."""
    return -(-tokenizer_vocab // 64) * 64


def job(args, method: str, nproc: int, work: Path, vocab: int) -> tuple[list[str], dict[str, str]]:
    """The torchrun command line and the environment variables of one method's job."""
    backend = args.backend or ("cusparselt" if args.device == "cuda" else "torch")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
           "-m", "benchmarks.torchtitan_train", "--module", "benchmarks.torchtitan_record", "--config", "llama3_sized",
           "--hf_assets_path", str(work / "tokenizer"), "--dataloader.dataset_path", str(work / "corpus.jsonl"),
           "--training.steps", str(args.steps), "--training.local_batch_size", str(args.batch),
           "--training.seq_len", str(args.seq_len), "--lr_scheduler.warmup_steps", str(max(1, args.steps // 10)),
           "--metrics.log_freq", "1", "--dump_folder", str(work / method),
           "--sparsity24.method", method]
    if method != "dense":
        cmd += ["--sparsity24.backend", backend]
        cmd += ["--sparsity24.mvue"] if args.mvue else []
        cmd += ["--sparsity24.transposable"] if args.transposable else []
    if args.device == "cpu":
        cmd += ["--training.mixed_precision_param", "float32"]  # bf16 products are slow on the CPU, and gloo sums float32
    env = {**MULTICAST_OFF, "SPARSITY_LAB_RECORD": str(work / f"record_{method}.json"),
           "SPARSITY_LAB_TITAN_MODEL": f"dim={args.dim},layers={args.layers},heads={args.heads},vocab={vocab}",
           "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    if args.device == "cpu":
        env["SPARSITY_LAB_TITAN_DEVICE"] = "cpu"
    if args.profile_steps:
        env[PROFILE_ENV] = args.profile_steps
    return cmd, env


def shown(cmd: list[str], env: dict[str, str]) -> str:
    """The job as one shell line (python's path shortened to python)."""
    words = ["python" if w == sys.executable else w for w in cmd]
    return " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()) + " " + " ".join(shlex.quote(w) for w in words)


def run_job(cmd: list[str], env: dict[str, str], log: Path, timeout: int) -> dict:
    """Run one job, its output to ``log``; returns the return code (None: stopped at the timeout) and wall time."""
    start = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 15)  # the job's own process group: torchrun and its workers
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                proc.wait()
            code = None
    return {"returncode": code, "wall_s": round(time.perf_counter() - start, 1)}


def log_tail(log: Path, lines: int = 30) -> str:
    """The log's first lines that name an error (torchrun's own report comes last and hides the cause), then its end."""
    if not log.exists():
        return ""
    text = log.read_text(errors="replace").splitlines()
    first = [line for line in text if re.search(r"Error|error:|Unrecognized|Traceback", line)][:10]
    return "\n".join(first + ["..."] + text[-lines:])


def summarize(runs: dict[str, dict]) -> dict:
    """Per method: the recorder's medians after the first two steps (torchtitan's tokens/s per GPU, and the
    same from the synchronised step time), peak reserved memory, first and last loss; tokens/s against dense."""
    summary = {}
    for method, run in runs.items():
        rec = run.get("record")
        if rec is None:
            summary[method] = {"failed": True}
            continue
        losses = [x for x in rec["losses"] if x is not None]
        step_s, tokens = rec["median_step_s_after_2"], rec["tokens_per_step_per_device"]
        summary[method] = {"tokens_per_s_per_gpu": rec["median_tokens_per_s_per_device_after_2"],
                           "tokens_per_s_per_gpu_from_step_time": tokens / step_s if step_s else None,
                           "median_step_s": step_s,
                           "max_reserved_gib": rec["max_reserved_gib"],
                           "first_loss": losses[0] if losses else None, "last_loss": losses[-1] if losses else None,
                           "two_four_every_step": rec["two_four_every_step"]}
        if rec.get("profile"):
            summary[method]["ms_per_step_by_category"] = rec["profile"]["ms_per_step_by_category"]
    dense = summary.get("dense", {}).get("tokens_per_s_per_gpu")
    for method, row in summary.items():
        if method != "dense" and dense and row.get("tokens_per_s_per_gpu"):
            row["tokens_per_s_vs_dense"] = row["tokens_per_s_per_gpu"] / dense
    return summary


def result_name(args, nproc: int, gpu: str | None) -> str:
    if args.name:
        return args.name
    if args.device == "cpu" or not gpu:
        tag = "cpu"
    else:
        found = re.search(r"\b([A-Za-z]\d{2,4})\b", gpu)  # "NVIDIA H100 80GB HBM3" -> h100
        tag = found.group(1).lower() if found else re.sub(r"[^a-z0-9]+", "_", gpu.lower()).strip("_")
    return f"{RESULT_PREFIX}_{tag}x{nproc}"


def write_report(args, nproc: int, vocab: int, data: dict, runs: dict[str, dict]) -> tuple[Path, dict]:
    """results/<name>.json (``--out-dir``) with provenance, the settings, the data, each job and the summary."""
    from sparsity_lab.provenance import provenance, write_result

    summary = summarize(runs)
    info = provenance()
    settings = {k: getattr(args, k) for k in ("device", "methods", "mvue", "transposable", "steps", "dim", "layers",
                                              "heads", "seq_len", "batch")}
    settings.update(backend=args.backend or ("cusparselt" if args.device == "cuda" else "torch"), model_vocab=vocab,
                    tokens_per_step_per_gpu=args.batch * args.seq_len, warmup_steps=max(1, args.steps // 10))
    payload = {"world_size": nproc, "gpu": info.get("gpu"), "env": MULTICAST_OFF, "settings": settings, "data": data,
               "summary": summary, "runs": runs}
    try:
        import torchtitan
        payload["torchtitan"] = torchtitan.__version__
    except ImportError:
        payload["torchtitan"] = None
    path = write_result(result_name(args, nproc, info.get("gpu")), payload, directory=args.out_dir)
    return path, summary


def run(args) -> int:
    nproc = world_size(args)
    work = Path(args.work_dir).resolve()
    vocab_guess = model_vocab(args.vocab)
    if args.dry_run:
        for method in args.methods:
            print(shown(*job(args, method, nproc, work, vocab_guess)))
        return 0
    work.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    data = prepare_data(work, args.vocab, args.max_corpus_mb * 2**20)
    data["prepare_s"] = round(time.perf_counter() - start, 1)
    vocab = model_vocab(data["tokenizer_vocab"])
    print(f"corpus: {data['documents']} documents, {data['bytes'] / 2**20:.1f} MiB; tokenizer: "
          f"{data['tokenizer_vocab']} tokens (model vocabulary {vocab}); {data['prepare_s']} s", flush=True)
    runs = {}
    for method in args.methods:
        cmd, env = job(args, method, nproc, work, vocab)
        record_path, log = Path(env["SPARSITY_LAB_RECORD"]), work / f"{method}.log"
        record_path.unlink(missing_ok=True)
        print(f"{method}: {shown(cmd, env)}", flush=True)
        outcome = run_job(cmd, env, log, args.run_timeout)
        entry = {"command": shown(cmd, env), "log": str(log), **outcome}
        if outcome["returncode"] == 0 and record_path.exists():
            entry["record"] = json.loads(record_path.read_text())
            print(f"{method}: done in {outcome['wall_s']} s", flush=True)
        else:
            why = "timed out" if outcome["returncode"] is None else f"exit status {outcome['returncode']}"
            entry["error"] = f"{why}; no record" if outcome["returncode"] == 0 else why
            entry["log_tail"] = log_tail(log)
            print(f"{method}: FAILED ({entry['error']}) after {outcome['wall_s']} s; end of {log}:\n"
                  f"{entry['log_tail']}", flush=True)
        runs[method] = entry
        path, summary = write_report(args, nproc, vocab, data, runs)  # after each job: a later one may be cut off
    for method, row in summary.items():
        if row.get("failed"):
            print(f"{method:<22} failed")
            continue
        ratio = f"  x{row['tokens_per_s_vs_dense']:.3f} vs dense" if "tokens_per_s_vs_dense" in row else ""
        print(f"{method:<22} {row['tokens_per_s_per_gpu'] or float('nan'):>10.0f} tok/s/GPU  "
              f"peak {row['max_reserved_gib'] or float('nan'):.2f} GiB  loss {row['first_loss']} -> "
              f"{row['last_loss']}{ratio}")
    print(f"wrote {path}")
    return 0 if all("record" in r for r in runs.values()) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks torchtitan-gpus", description=__doc__.splitlines()[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        check_arguments(args)
    except ValueError as err:
        parser.error(str(err))
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
