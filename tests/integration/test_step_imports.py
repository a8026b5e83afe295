"""Each step imports what its path needs and no more (issue 57 §1): run in a fresh interpreter, each path's
``sys.modules`` at the end holds none of the libraries only another path uses.

- detect_drift with no champion says so without the comparison's libraries (scipy.stats, DVC, the champion's
  model and its lineage) — it still needs MLflow, to ask for the champion and to log its run;
- profile_training reading a finished run needs no training stack and no pyplot;
- evaluate_model's charts draw on matplotlib's Figure and Agg canvas, not pyplot.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

#: Prints, after the code, which of these modules the interpreter loaded.
_REPORT = """
import json, sys
heavy = {heavy!r}
print("LOADED " + json.dumps(sorted(m for m in heavy if m in sys.modules)))
"""


def _loaded(code: str, heavy: list[str], cwd: Path) -> list[str]:
    proc = subprocess.run(
        [sys.executable, "-c", code + _REPORT.format(heavy=heavy)],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("LOADED "))
    return json.loads(line[len("LOADED ") :])


@pytest.mark.integration
def test_detect_drift_with_no_champion_loads_nothing_the_comparison_needs(tmp_path):
    data = tmp_path / "new.csv"
    data.write_text("a,b,label\n" + "".join(f"{i},{i % 3},{i % 2}\n" for i in range(20)))
    code = f"""
from trainpipe.components.detect_drift.core import detect_drift
from trainpipe.components.detect_drift.spec import DetectDriftConfig
from trainpipe.contract.lineage import Lineage
config = DetectDriftConfig(
    data={str(data)!r}, model_name="nobody", tracking_uri="sqlite:///{tmp_path}/mlflow.db",
    output_dir={str(tmp_path / "out")!r},
)
result = detect_drift(config, Lineage())
assert result.retrain and "nothing to compare with" in result.reasons[0], result.reasons
"""
    heavy = [
        "torch",
        "sklearn",
        "scipy.stats",
        "dvc",
        "great_expectations",
        "matplotlib",
        "trainpipe.services.lineage_report",
        "trainpipe.services.serving.nets",
    ]
    assert _loaded(code, heavy, tmp_path) == []


def _rank(rank: int) -> dict:
    step = {"samples": 32, "step_s": 0.01, "data_s": 0.001, "forward_s": 0.003, "backward_s": 0.004}
    return {"rank": rank, "peak_rss_mb": 100.0, "threads": 1, "steps": [{**step, "optimizer_s": 0.002}] * 10}


@pytest.mark.unit
def test_profile_training_of_a_finished_run_loads_no_training_stack_and_no_pyplot(tmp_path):
    model = tmp_path / "model"
    (model / "telemetry").mkdir(parents=True)
    for r in (0, 1):
        (model / "telemetry" / f"rank{r}.json").write_text(json.dumps(_rank(r)))
    code = f"""
from trainpipe.components.profile_training.core import profile_training
from trainpipe.components.profile_training.spec import ProfileTrainingConfig
from trainpipe.contract.lineage import Lineage
result = profile_training(ProfileTrainingConfig(model={str(model)!r}, output_dir={str(tmp_path / "out")!r}), Lineage())
assert result.world_size == 2 and "<img" in open({str(tmp_path / "out" / "report.html")!r}).read()
"""
    heavy = ["torch", "trainpipe.training.launch", "trainpipe.training.settings", "matplotlib.pyplot", "mlflow"]
    heavy.append("sklearn")
    assert _loaded(code, heavy, tmp_path) == []


@pytest.mark.unit
def test_evaluate_model_charts_draw_without_pyplot(tmp_path):
    code = """
import numpy as np
from trainpipe.components.evaluate_model.core import charts, regression_charts
y = np.array([0, 1, 2, 1, 0, 2])
proba = np.eye(3)[y] * 0.8 + 0.2 / 3
assert len(charts(y, proba, [0, 1, 2], [[2, 0, 0], [0, 2, 0], [0, 0, 2]])) == 3
assert len(regression_charts([1.0, 2.0, 3.0], [1.1, 1.9, 3.2])) == 3
"""
    assert _loaded(code, ["matplotlib.pyplot", "torch", "mlflow"], tmp_path) == []
