"""The 2:4 activation accuracy recorder (benchmarks/act24_accuracy.py) and its verdicts (act24_verdicts.py)."""
import json

import pytest
from _lab_testing import exit_status

from benchmarks.act24_accuracy import SETTINGS_ORDER, main
from benchmarks.act24_verdicts import judge_act24

TINY = ["--device", "cpu", "--layers", "1", "--width", "32", "--context", "32", "--batch-size", "4", "--steps", "6",
        "--eval-interval", "3", "--eval-batches", "2", "--data-max-bytes", "200000", "--no-progress"]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    out = tmp_path_factory.mktemp("act24_accuracy")
    assert main(["--seeds", "0", "1", "--out-dir", str(out), *TINY]) == 0
    return json.loads((out / "act24_accuracy_cpu.json").read_text())


def test_the_recorder_writes_every_setting_at_every_seed(recorded):
    assert set(recorded) == {"provenance", "settings", "runs", "seeds", "verdicts"}
    assert recorded["provenance"]["command"].startswith("python -m benchmarks act24-accuracy --seeds 0 1 --device cpu "
                                                        "--backend torch")
    assert list(recorded["runs"]) == list(SETTINGS_ORDER) and list(recorded["seeds"]) == ["0", "1"]
    for seed, per in recorded["seeds"].items():
        assert list(per) == list(SETTINGS_ORDER)
        assert all(s["step"] == 6 and s["final_val_loss"] > 0 for s in per.values())
    # runs: the first seed in the first recording's layout (notebook 13 reads it)
    for setting, run in recorded["runs"].items():
        summary = run["summary"]
        assert summary["config"]["seed"] == 0 and summary["config"]["steps"] == 6
        assert summary["final_val_loss"] == recorded["seeds"]["0"][setting]["final_val_loss"]
        assert [e["step"] for e in run["evals"]] == [3, 6]
        assert ("act_zero" in run["evals"][-1]) == (setting != "gelu")  # the squared ReLU's natural sparsity
    models = {k: r["summary"]["config"]["model"] for k, r in recorded["runs"].items()}
    assert [m["ffn_kind"] for m in models.values()] == ["gelu", "relu2", "relu2", "relu2", "relu2"]
    assert [m["activation_sparsity"] for m in models.values()] == ["none", "none", "2:4", "2:4", "2:4"]
    assert [m["act24_weight_grads"] for m in models.values()] == ["dense"] * 4 + ["tokens24"]
    for per in recorded["seeds"].values():  # the dropped share, measured on the trained model
        drop = per["act24_tok24"]["tokens24_dropped"]
        assert set(drop) == {"dW2_mass", "dW1_mass", "dW2_count", "dW1_count"}
        assert all(0.0 <= v <= 1.0 for v in drop.values())
        assert all("tokens24_dropped" not in per[k] for k in SETTINGS_ORDER[:4])
    assert set(recorded["runs"]["act24_tok24"]["summary"]["tokens24_dropped"]["per_block"]) == {"blocks.0.mlp"}
    combined = recorded["runs"]["act24_ste"]["summary"]["config"]
    assert combined["method"] == "ste" and combined["method_options"] == {
        "transposable": True, "backend": "torch", "dense_finetune_at": 0.9}
    assert recorded["runs"]["act24"]["summary"]["config"]["method"] == "dense"
    # the second seed trains from other weights and batches
    assert recorded["seeds"]["1"]["relu2"]["final_val_loss"] != recorded["seeds"]["0"]["relu2"]["final_val_loss"]


def test_two_seeds_are_not_judged(recorded):
    assert len(recorded["verdicts"]) == 4
    for v in recorded["verdicts"]:
        assert v["holds"] is None and v["evidence"].startswith("not judged: 2 seeds")


def finals(**columns):
    """{seed: {setting: loss}} from setting=[loss per seed]."""
    n = len(next(iter(columns.values())))
    return {str(s): {k: v[s] for k, v in columns.items()} for s in range(n)}


def test_verdicts_hold():
    v = judge_act24(finals(gelu=[1.90, 1.92, 1.91], relu2=[1.74, 1.75, 1.73], act24=[1.745, 1.76, 1.73],
                           act24_ste=[1.76, 1.78, 1.75], act24_tok24=[1.75, 1.755, 1.74]))
    assert [x["holds"] for x in v] == [True, True, True, True]
    assert v[0]["values"]["outcome"] == "relu2 lower" and not v[0]["values"]["ranges_overlap"]
    assert v[2]["values"]["holds_on_mean"] is True and v[2]["seeds"] == [0, 1, 2]


def test_verdicts_fail():
    # ranges overlap; act24 1.7 % worse at seed 1; the combined method within 2 % on the mean but not at seed 2
    v = judge_act24(finals(gelu=[1.76, 1.80, 1.78], relu2=[1.74, 1.75, 1.79], act24=[1.74, 1.78, 1.79],
                           act24_ste=[1.75, 1.76, 1.83], act24_tok24=[1.74, 1.75, 1.81]))
    assert [x["holds"] for x in v] == [False, False, False, False]
    assert v[3]["values"]["max_gap"] == pytest.approx(1.81 / 1.79 - 1)
    assert v[0]["values"]["outcome"] == "ranges overlap"
    assert v[1]["values"]["max_gap"] == pytest.approx(1.78 / 1.75 - 1)
    assert v[2]["values"]["holds_on_mean"] is True
    gelu_lower = judge_act24(finals(gelu=[1.6, 1.6, 1.6], relu2=[1.7, 1.7, 1.7], act24=[1.7] * 3, act24_ste=[1.7] * 3))
    assert gelu_lower[0]["holds"] is False and gelu_lower[0]["values"]["outcome"] == "gelu lower"


def test_verdicts_not_judged():
    one = judge_act24(finals(gelu=[1.9], relu2=[1.74], act24=[1.74], act24_ste=[1.76], act24_tok24=[1.75]))
    assert all(x["holds"] is None and x["evidence"].startswith("not judged: 1 seed ") for x in one)
    assert one[2]["values"]["holds_on_mean"] is None
    short = judge_act24(finals(gelu=[1.9] * 3, relu2=[1.74] * 3, act24=[1.74] * 3, act24_ste=[1.76] * 3,
                               act24_tok24=[1.75] * 3), steps=6)
    assert all(x["holds"] is None and x["evidence"].startswith("not judged: 6 steps") for x in short)
    assert judge_act24(finals(gelu=[1.9] * 3, relu2=[1.74] * 3, act24=[1.74] * 3, act24_ste=[1.76] * 3),
                       steps=400)[2]["holds"] is True
    missing = judge_act24(finals(gelu=[1.9] * 3, relu2=[1.74] * 3, act24=[1.74] * 3))
    assert missing[2]["holds"] is None and "act24_ste" in missing[2]["evidence"]
    assert missing[3]["holds"] is None and "act24_tok24" in missing[3]["evidence"]  # recorded before it existed
    with pytest.raises(ValueError, match="at least one seed"):
        judge_act24({})


@pytest.mark.parametrize("argv, flag", [
    (["--steps", "0"], "--steps"), (["--width", "30"], "--width"), (["--heads", "3"], "--heads"),
    (["--seeds", "1", "1"], "--seeds"), (["--backend", "nope"], "--backend"), (["--name", "x.json"], "--name"),
    (["--eval-batches", "0"], "--eval-batches"), (["--data-max-bytes", "0"], "--data-max-bytes"),
    (["--data", "/nonexistent/corpus.txt"], "/nonexistent/corpus.txt"),
])
def test_bad_arguments_name_the_flag(argv, flag, tmp_path, capsys):
    args = [a for a in TINY if a != "--no-progress"]
    assert exit_status(main, [*args, "--no-progress", "--out-dir", str(tmp_path), *argv]) == 2
    err = capsys.readouterr().err
    assert flag in err and "error" in err
    assert not list(tmp_path.iterdir())  # nothing written


def test_argparse_errors_name_the_flag(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--seeds", "zero"])
    assert exit_.value.code == 2 and "--seeds" in capsys.readouterr().err


def test_the_command_is_registered():
    from benchmarks.__main__ import BENCHMARKS

    assert BENCHMARKS["act24-accuracy"][0] == "benchmarks.act24_accuracy"


def test_device_cuda_without_a_gpu_names_the_flag(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is present: --device cuda is valid here")
    assert main(["--device", "cuda", "--steps", "1"]) == 2
    assert "--device cuda" in capsys.readouterr().err


@pytest.mark.gpu
def test_the_recorder_runs_every_setting_on_cusparselt(tmp_path):
    """The GPU set-up of the recorded run (bf16, products on cuSPARSELt) at a small size: every setting trains."""
    argv = ["--seeds", "0", "--device", "cuda", "--layers", "1", "--width", "256", "--context", "64", "--batch-size",
            "8", "--steps", "4", "--eval-interval", "2", "--eval-batches", "2", "--data-max-bytes", "200000",
            "--no-progress", "--out-dir", str(tmp_path), "--name", "gpu_check"]
    assert main(argv) == 0
    result = json.loads((tmp_path / "gpu_check.json").read_text())
    assert result["settings"]["backend"] == "cusparselt"
    assert all(s["final_val_loss"] > 0 for s in result["seeds"]["0"].values())
    assert result["runs"]["act24_ste"]["summary"]["config"]["method_options"]["backend"] == "cusparselt"
    assert result["runs"]["act24_tok24"]["summary"]["config"]["model"]["act24_weight_grads"] == "tokens24"
    assert 0.0 <= result["seeds"]["0"]["act24_tok24"]["tokens24_dropped"]["dW2_mass"] <= 1.0
