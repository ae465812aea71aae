"""benchmarks.sass_counts: the step's 2:4 kernels compiled for sm_90 here (no GPU) and their SASS counted per
helper from the cubin's line table."""
import collections
import json
import os
import subprocess
import sys
from pathlib import Path

from benchmarks import sass_counts

ROOT = Path(__file__).resolve().parent.parent


def test_line_table_parsing_counts_each_instruction_once_under_its_line():
    sass = """
	//## File "/x/kernels/compress24.py", line 42
        /*0000*/                   LOP3.LUT R81, R81, 0xffffffbf, RZ, 0xc0, !PT ;
        /*0010*/               @P1 SEL R2, R3, R4, P0 ;
	//## File "/x/kernels/mvue24.py", line 7
        /*0020*/                   NOP ;
        /*0030*/              @!P2 FSETP.GT.AND P0, PT, R1, R2, PT ;
"""
    counts = sass_counts.count_lines(sass)
    assert counts == collections.Counter({("compress24.py", 42, "LOP3"): 1, ("compress24.py", 42, "SEL"): 1,
                                          ("mvue24.py", 7, "FSETP"): 1})


def test_kernel_11_compiles_offline_and_every_instruction_is_attributed(tmp_path):
    # in a process of its own: the test session runs Triton's interpreter, whose kernels do not compile
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    subprocess.run([sys.executable, "-m", "benchmarks.sass_counts", "--kernels", "11", "--json", "--out-dir",
                    str(tmp_path)], cwd=ROOT, env=env, check=True, capture_output=True, timeout=300)
    (path,) = tmp_path.glob("sass_counts_triton*.json")
    result = json.loads(path.read_text())
    assert result["provenance"]["command"].startswith("python -m benchmarks.sass_counts --kernels 11 --json")
    (k,) = result["kernels"]
    assert k["kernel"] == "11 prepare24"
    assert sum(k["helpers"].values()) == k["instructions_per_thread"] == sum(k["opcodes"].values())
    assert k["alu_pipe"] + k["fma_pipe"] + k["other"] == k["instructions_per_thread"]
    assert k["elements_per_thread"] == 64 * 64 / (32 * k["num_warps"])
    # the helpers named are the kernel's own: its compressed store and the pick of the kept pair
    assert {"_pick", "_store_compressed", "_prepare24_kernel"} <= set(k["helpers"])
    assert k["instructions_per_element"] > 5


def test_under_the_interpreter_it_says_what_to_unset():
    import pytest

    if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        pytest.skip("the test session does not run the interpreter")
    with pytest.raises(RuntimeError, match="unset TRITON_INTERPRET"):
        sass_counts.measure(["11"])


def test_compiled_fp8_forms_convert_with_the_gpu_instruction(tmp_path):
    """Kernel 24's E4M3 form, compiled for sm_90: one F2FP (the hardware FP8 conversion) per element a
    thread holds, and none of the float32 rounding the interpreter needs."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    subprocess.run([sys.executable, "-m", "benchmarks.sass_counts", "--kernels", "24", "--json", "--out-dir",
                    str(tmp_path)], cwd=ROOT, env=env, check=True, capture_output=True, timeout=300)
    (path,) = tmp_path.glob("sass_counts_triton*.json")
    kernels = {k["kernel"]: k for k in json.loads(path.read_text())["kernels"]}
    fp8, bf16 = kernels["24 refresh24_cutlass_fp8"], kernels["24 refresh24_cutlass"]
    assert fp8["opcodes"]["F2FP"] == fp8["elements_per_thread"] and "F2FP" not in bf16["opcodes"]
    assert "_hardware_fp8_byte" in fp8["helpers"] and "_round_to_fp8_grid" not in fp8["helpers"]


def test_kernel_20_moves_no_value_between_threads(tmp_path):
    """The optimizer's kernel 20 reads and writes every tensor in one layout (runs of 4 weights a thread): no barrier
    and no shared-memory access in either form (a bf16 or mask access of its own width would convert through shared
    memory: 11 and 25 barriers a thread before)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    subprocess.run([sys.executable, "-m", "benchmarks.sass_counts", "--kernels", "20", "--json", "--out-dir",
                    str(tmp_path)], cwd=ROOT, env=env, check=True, capture_output=True, timeout=300)
    (path,) = tmp_path.glob("sass_counts_triton*.json")
    kernels = {k["kernel"]: k for k in json.loads(path.read_text())["kernels"]}
    assert set(kernels) == {"20 adamw_master", "20 adamw_master masked decay"}
    for k in kernels.values():
        assert k["barriers"] == 0 and k["shared_memory"] == 0, k["kernel"]
    assert kernels["20 adamw_master"]["instructions_per_element"] < kernels["20 adamw_master masked decay"]["instructions_per_element"]
