"""The README's training function, as written, trains through train_model (so the example cannot
rot): its package beside a small model of the test's own, one rank, on digits, until its early stopping
leaves the loop (two of three epochs)."""

from __future__ import annotations

import json
import re

import pytest

from tests.conftest import REPO, result_of, run_component

pytestmark = pytest.mark.integration

MODEL = """import torch
from torch import nn


class MyNet(nn.Module):
    def __init__(self, width: int, n_classes: int) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(64, width), nn.ReLU(), nn.Linear(width, n_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x / 16.0)
"""


def _example(readme: str) -> str:
    (block,) = [
        b
        for b in re.findall(r"```python\n(.*?)```", (REPO / readme).read_text(), flags=re.S)
        if "def train(ctx, config)" in b
    ]
    return block


def test_the_readme_training_function_trains_as_written(tmp_path, digits_csv, mlflow_server):
    code = _example("README.md")
    assert (
        code.split("import torch", 1)[1] == _example("components/train_model/README.md").split("import torch", 1)[1]
    )  # one example
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "train.py").write_text(code)
    (pkg / "models.py").write_text(MODEL)
    r = result_of(
        run_component(
            "train_model",
            "--data",
            str(digits_csv),
            "--output-dir",
            str(tmp_path / "m"),
            "--tracking-uri",
            mlflow_server,
            "--train-function",
            "mypkg.train:train",
            "--train-config",
            '{"width": 32, "lr": 0.01, "patience": 1, "min_delta": 100}',  # no epoch improves by 100: it stops
            "--nproc-per-node",
            "1",
            "--epochs",
            "3",
            env={"PYTHONPATH": str(tmp_path)},
        )
    )
    assert r["train_function"] == "mypkg.train:train" and r["metrics"]["loss"] < 1.0
    assert r["global_steps"] == 2 * 22  # early stopping: it left its loop as the third epoch began (22 steps each)
    lines = (tmp_path / "m" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["epoch"] for x in lines] == [0, 1]
    newest = sorted((tmp_path / "m" / "checkpoints").glob("ckpt-*"))[-1]
    assert newest.name == "ckpt-0000000044" and json.loads((newest / "trainer.json").read_text())["ended"]
    assert json.loads((tmp_path / "m" / "model.json").read_text())["builder"] == "mypkg.models:MyNet"
