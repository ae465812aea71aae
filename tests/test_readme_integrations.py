"""The README's "Use it with your model" blocks run as they are (in a temporary directory)."""
import re
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def blocks():
    text = (ROOT / "README.md").read_text()
    section = text.split("## Use it with your model", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.+?)\n```", section, re.S)


def test_readme_integration_blocks_run(tmp_path, monkeypatch):
    pytest.importorskip("transformers")
    code = blocks()
    assert len(code) == 2
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    namespace: dict = {}
    exec(compile(code[0], "README block 1", "exec"), namespace)
    history = [entry for entry in namespace["trainer"].state.log_history if "loss" in entry]
    assert history and all("flip_rate" in entry for entry in history)
    with pytest.warns(UserWarning, match="run dense products"):
        exec(compile(code[1], "README block 2", "exec"), namespace)
    x = torch.randint(0, 64, (1, 8))
    with torch.no_grad():
        assert torch.equal(namespace["served"](input_ids=x).logits, namespace["model"].eval()(input_ids=x).logits)
    assert (tmp_path / "runs/hf/compressed/model.safetensors").is_file()


def test_readme_torchtitan_config_builds_the_converter(tmp_path):
    pytest.importorskip("torchtitan.protocols.model_converter", reason="the converter needs torchtitan 0.2")
    from torchtitan.config import ConfigManager
    from torchtitan.distributed import ParallelDims
    from torchtitan.protocols.model_converter import build_model_converters

    text = (ROOT / "README.md").read_text()
    section = text.split("## Use it with your model", 1)[1].split("\n## ", 1)[0]
    (toml,) = re.findall(r"```toml\n(.+?)\n```", section, re.S)
    path = tmp_path / "job.toml"
    path.write_text(toml)
    job = ConfigManager().parse_args(["--job.config_file", str(path)])
    assert job.model.converters == ["sparsity24"]
    one = ParallelDims(dp_replicate=1, dp_shard=1, cp=1, tp=1, pp=1, ep=1, etp=1, world_size=1)
    (converter,) = build_model_converters(job, one).converters
    assert converter.method.describe() == "sste 2:4, transposable, MVUE dW"
