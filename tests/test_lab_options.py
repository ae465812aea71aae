"""The model options of train/compare/decay-search: a head count that fits any width unless --heads is
given, and a clear error naming --heads and --width when a given one does not divide the width."""
import pytest
from _lab_testing import cli_code

from sparsity_lab.lab.cli import build_parser, main
from sparsity_lab.lab.options import default_heads, model_options


@pytest.mark.parametrize("width, heads", [(384, 6), (128, 2), (64, 1), (16, 1), (256, 4), (200, 2), (192, 3), (100, 1)])
def test_default_heads_divide_the_width(width, heads):
    assert default_heads(width) == heads and width % heads == 0


def test_every_width_gets_a_head_count_that_divides_it():
    assert all(w % default_heads(w) == 0 and default_heads(w) >= 1 for w in range(1, 1025))


@pytest.mark.parametrize("command", ["train", "compare", "decay-search"])
def test_the_width_alone_picks_the_heads(command):
    args = build_parser(command).parse_args([command, "--width", "128"])
    assert model_options(args) == {"d_model": 128, "n_head": 2}
    args = build_parser(command).parse_args([command, "--width", "128", "--heads", "8"])
    assert model_options(args)["n_head"] == 8


def test_help_states_the_head_default(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "must divide --width" in text and "2 at 128" in text


@pytest.mark.parametrize("argv, message", [
    (["--width", "128", "--heads", "6"], "--heads 6 does not divide --width 128"),
    (["--heads", "0"], "argument --heads: expected a positive integer, got '0'"),
])
def test_a_given_head_count_that_does_not_fit_is_one_clear_line(tmp_path, capsys, argv, message):
    code = cli_code(["train", "--steps", "1", "--no-progress", "--out", str(tmp_path / "r"), *argv])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err
    assert "leave --heads out" in err or "positive" in err


@pytest.mark.parametrize("command", ["train", "compare", "decay-search"])
def test_masks_in_graph_flags_reach_the_config(command):
    from sparsity_lab.lab.options import config_from_args

    def config(*argv):
        return config_from_args(build_parser(command).parse_args([command, *argv]))
    assert not config().masks_in_graph and not config().cuda_graph
    assert config("--cuda-graph").masks_in_graph is False  # eager refresh: the measured faster default
    assert config("--cuda-graph", "--masks-in-graph").masks_in_graph
    assert config("--cuda-graph", "--no-masks-in-graph").masks_in_graph is False
    with pytest.raises(ValueError, match="--masks-in-graph.*add --cuda-graph"):
        config("--masks-in-graph")


def test_masks_in_graph_without_cuda_graph_is_one_clear_line(tmp_path, capsys):
    code = main(["train", "--steps", "1", "--no-progress", "--out", str(tmp_path / "r"), "--masks-in-graph"])
    err = capsys.readouterr().err
    assert code == 2 and "--masks-in-graph" in err and "Traceback" not in err
