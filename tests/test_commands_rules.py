"""The rules by which tests/test_commands_run.py reads and shrinks printed commands (tests/_commands.py):
they must find every command, shrink without dropping one, and name a failing Things-to-try block."""
from pathlib import Path

import pytest
from _commands import fenced_blocks, plan, python_blocks_failure, runnable_inline_spans, shell_commands

TMP = Path("/tmp/cmd-test")


def one(line: str):
    [command] = shell_commands(line, "X")
    return command


def test_blocks_lines_continuations_comments_and_chains():
    text = "prose\n```bash\n# a comment\nsparsity-lab train --steps 300 \\\n  --width 128   # CPU-sized\n\n" \
           "TRITON_INTERPRET=1 pytest -q tests/test_kernels_prune24.py\n```\nmore\n```python\nx = 1\n```\n"
    blocks = fenced_blocks(text)
    assert [(lang, line) for lang, _, line in blocks] == [("bash", 3), ("python", 11)]
    commands = shell_commands(blocks[0][1], "README.md", blocks[0][2])
    assert [c.argv for c in commands] == [["sparsity-lab", "train", "--steps", "300", "--width", "128"],
                                         ["pytest", "-q", "tests/test_kernels_prune24.py"]]
    assert commands[0].comment == "# CPU-sized" and commands[0].where == "README.md line 4"
    assert commands[1].env == {"TRITON_INTERPRET": "1"} and commands[1].where == "README.md line 7"
    chain = shell_commands('python -m pip install torch && python -m pip install -e ".[lab]" && python -m sparsity_lab course', "R")
    assert [c.argv[:3] for c in chain] == [["python", "-m", "pip"]] * 2 + [["python", "-m", "sparsity_lab"]]
    with pytest.raises(ValueError, match="one command per line"):
        shell_commands("sparsity-lab demo | head", "R")


def test_training_commands_are_shrunk_and_given_small_sizes():
    p = plan(one("sparsity-lab train --method masked_decay --steps 300 --layers 2 --width 128"), TMP, has_gpu=False)
    args = p.argv
    assert p.kind == "run" and args[:3] == ["train", "--method", "masked_decay"]
    value = {args[i]: args[i + 1] for i in range(1, len(args) - 1) if args[i].startswith("--") and not args[i + 1].startswith("--")}
    assert value["--steps"] == "3" and value["--layers"] == "1" and value["--width"] == "32"
    assert value["--context"] == "32" and value["--batch-size"] == "2" and "--no-progress" in args
    p = plan(one("sparsity-lab compare --steps 2 --out runs/compare --tokens 20e6"), TMP, has_gpu=False)
    assert p.argv[p.argv.index("--steps") + 1] == "2", "a value already small stays"
    assert p.argv[p.argv.index("--out") + 1] == "runs/compare", "relative: lands in the test's folder"
    assert p.argv[p.argv.index("--tokens") + 1] == "4096" and p.argv.count("--steps") == 1
    p = plan(one("sparsity-lab compare --out /home/me/runs/compare"), TMP, has_gpu=False)
    assert p.argv[p.argv.index("--out") + 1] == str(TMP / "out" / "compare")


@pytest.mark.parametrize("line", ["sparsity-lab train --width 384 --heads 6", "sparsity-lab train --heads 12",
                                  "sparsity-lab train --width 24 --heads 3"])
def test_shrunk_heads_divide_the_shrunk_width(line):
    p = plan(one(line), TMP, has_gpu=False)
    width, heads = (int(p.argv[p.argv.index(flag) + 1]) for flag in ("--width", "--heads"))
    assert width % heads == 0 and width % 4 == 0


def test_gpu_commands_are_only_parsed_without_a_gpu_and_run_with_one():
    for line in ("python -m benchmarks dyad --widths 4096 8192 --blocks 4 8 16",
                 "sparsity-lab compare --time-budget 300  # on a GPU",
                 "sparsity-lab train --device cuda"):
        assert plan(one(line), TMP, has_gpu=False).kind == "parse", line
        assert plan(one(line), TMP, has_gpu=True).kind == "run", line
    p = plan(one("python -m benchmarks kernels --mib 128"), TMP, has_gpu=True)
    assert p.argv[p.argv.index("--mib") + 1] == "1" and p.argv[p.argv.index("--out-dir") + 1] == str(TMP / "out")


def test_triton_on_the_cpu_runs_through_the_interpreter_for_one_run_only():
    p = plan(one("sparsity-lab train --method sste --backend triton"), TMP, has_gpu=False)
    assert p.kind == "run" and p.env == {"TRITON_INTERPRET": "1"}
    assert plan(one("sparsity-lab compare --backend triton_fp8sim"), TMP, has_gpu=False).kind == "parse"


def test_a_time_budget_becomes_a_few_steps():
    p = plan(one("sparsity-lab compare --time-budget 300 --max-tokens 20e6 --decay 1e-2"), TMP, has_gpu=False)
    assert "--time-budget" not in p.argv and "--max-tokens" not in p.argv
    assert p.argv[p.argv.index("--steps") + 1] == "3" and p.argv[p.argv.index("--decay") + 1] == "1e-2"


def test_skips_collects_and_refusals():
    assert plan(one("python -m pip install -e ."), TMP, False).kind == "skip"
    assert plan(one("python -m pytest"), TMP, False).kind == "skip"
    assert "JupyterLab" in plan(one("python -m sparsity_lab course"), TMP, False).reason
    assert plan(one("sparsity-lab course --headless"), TMP, False).kind == "skip"
    p = plan(one("TRITON_INTERPRET=1 pytest -q tests/test_kernels_prune24.py"), TMP, False)
    assert p.kind == "collect" and "--collect-only" in p.argv and p.env == {"TRITON_INTERPRET": "1"}
    assert plan(one("sparsity-lab decay-search --help"), TMP, False).argv == ["decay-search", "--help"]
    with pytest.raises(ValueError, match="the test runs `sparsity-lab"):
        plan(one("nvidia-smi"), TMP, False)


def test_runnable_inline_spans_are_found_and_names_pass():
    text = ("## Things to try\n- Set `n_blocks = 8` (a parameter), call `prune24(w, block=...)`, run `python -m benchmarks kernels` "
            "or `TRITON_INTERPRET=1 pytest -q x.py`.\n- Names: `live_shapes`, `seed=1`, `[512, 1024]`, `--method dense`."
            "\n```bash\nsparsity-lab demo\n```\n")
    assert runnable_inline_spans(text) == ["prune24(w, block=...)", "python -m benchmarks kernels",
                                           "TRITON_INTERPRET=1 pytest -q x.py"]


def test_a_failing_python_block_is_named(tmp_path):
    pytest.importorskip("papermill", reason="papermill is in the test extra")
    from _notebooks import tiny_notebook

    from sparsity_lab.course import is_current

    path = tiny_notebook(tmp_path / "nb", body="x = n * 2")
    copy = tmp_path / "copy" / path.name
    assert python_blocks_failure(path, ["assert x == 6", "print(x)"], tmp_path / "ok", executed_copy=copy) is None
    assert is_current(copy, path, "ci"), "the executed copy without the blocks is a run of the notebook itself"
    message = python_blocks_failure(path, ["y = x + 1", "raise ValueError('block two breaks')"], tmp_path / "bad")
    assert message.startswith("01_tiny.ipynb, Things to try, python block 2 of 2 failed:")
    assert "block two breaks" in message
    broken = tiny_notebook(tmp_path / "nb2", body="raise RuntimeError('the notebook itself')")
    assert "failed before its Things-to-try blocks" in python_blocks_failure(broken, ["print(1)"], tmp_path / "b2")


def test_torchrun_runs_two_processes_and_a_resume_keeps_its_checkpoint_sizes():
    p = plan(one("torchrun --nproc-per-node 8 -m sparsity_lab train --method sste --parallel fsdp --out runs/x"),
             TMP, has_gpu=False)
    assert p.kind == "run" and p.launcher == ["--standalone", "--nproc-per-node", "2"]
    assert p.argv[:3] == ["train", "--method", "sste"] and "--steps" in p.argv
    p = plan(one("torchrun --nproc-per-node 8 -m sparsity_lab train --parallel ddp --resume runs/x/checkpoint.dcp"),
             TMP, has_gpu=False)
    assert p.argv == ["train", "--parallel", "ddp", "--resume", "runs/x/checkpoint.dcp"]
    assert plan(one("torchrun --nproc-per-node 8 -m benchmarks dist"), TMP, has_gpu=False).kind == "parse"
