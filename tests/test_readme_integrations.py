"""The README's "Use it with your model" blocks run as they are (in a temporary directory)."""
import importlib.util
import re
import shlex
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def blocks():
    text = (ROOT / "README.md").read_text()
    section = text.split("## Use it with your model", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.+?)\n```", section, re.S)


def test_readme_integration_blocks_run(tmp_path, monkeypatch):
    transformers = pytest.importorskip("transformers")
    code = blocks()
    assert len(code) == 2
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    namespace: dict = {}
    exec(compile(code[0], "README block 1", "exec"), namespace)
    history = [entry for entry in namespace["trainer"].state.log_history if "loss" in entry]
    assert history and all("flip_rate" in entry for entry in history)
    exec(compile(code[1], "README block 2", "exec"), namespace)  # kernel="dense": no fallback to warn of
    x = torch.randint(0, 64, (1, 8))
    with torch.no_grad():
        assert torch.equal(namespace["served"](input_ids=x).logits, namespace["model"].eval()(input_ids=x).logits)
    assert (tmp_path / "runs/hf/compressed/model.safetensors").is_file()
    # the training checkpoint and the exported model's save_pretrained: plain transformers loads the 2:4 model
    for saved in ("runs/hf/sparse", "runs/hf/served"):
        plain = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / saved).eval()
        with torch.no_grad():
            assert torch.equal(plain(input_ids=x).logits, namespace["model"](input_ids=x).logits), saved


def test_readme_torchtitan_command_parses():
    pytest.importorskip("torchtitan.protocols.model", reason="the integration needs torchtitan 0.3")
    from torchtitan.config import ConfigManager

    from sparsity_lab.integrations import torchtitan as tt

    text = (ROOT / "README.md").read_text()
    section = text.split("## Use it with your model", 1)[1].split("\n## ", 1)[0]
    (command,) = [c for c in re.findall(r"```bash\n(.+?)\n```", section, re.S) if "torchtitan_train" in c]
    args = shlex.split(command.replace("\\\n", " "))
    launcher = "sparsity_lab.integrations.torchtitan_train"
    assert importlib.util.find_spec(launcher), f"the README's launcher {launcher} is not a module"
    config = ConfigManager().parse_args(args[args.index(launcher) + 1:])
    assert isinstance(config, tt.Sparsity24Trainer.Config) and config.training.steps == 300
    method = tt.method_from_config(config.sparsity24, config.training.steps)
    assert method.describe() == "sste 2:4, row-wise, MVUE dW"
