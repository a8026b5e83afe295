"""An Airflow task killed outright while its training checkpoints (the supervisor's SIGKILL after its SIGTERM, an
OOM kill of the task process) leaves nothing of trainpipe's in the temp folder: the step, told by its lifeline,
checkpoints and writes its error record, which no folder of the temp folder holds (a deployment found a
``trainpipe-*/error.json`` there after each such kill)."""

from __future__ import annotations

import getpass
import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.integration

#: The Airflow task process: the operator, run as Airflow's task runner runs it.
TASK = """
import json, sys
from types import SimpleNamespace
from trainpipe.components.train_model.airflow_task import TrainModelOperator
settings = json.loads(sys.argv[1])
context = {"run_id": "manual__1", "ti": SimpleNamespace(try_number=1, task=SimpleNamespace(retries=1))}
TrainModelOperator(task_id="train", settings=settings).execute(context)
"""


def test_a_task_killed_while_its_training_checkpoints_leaves_nothing_in_the_temp_folder(tmp_path, digits_csv):
    temp, out, log = tmp_path / "temp", tmp_path / "m", tmp_path / "task.log"
    temp.mkdir()
    settings = {
        "data": str(digits_csv),
        "output_dir": str(out),
        "tracking_uri": f"sqlite:///{tmp_path / 'ml.db'}",
        "epochs": 2,
        "batch_size": 64,
        "nproc_per_node": 1,
        "train_function": "teampkg.slow:train",  # 22 steps an epoch, 0.1 s each: the kill lands in the second
        "train_config": {"sleep_s": 0.1},
    }
    team = [*filter(None, [os.environ.get("PYTHONPATH")]), str(REPO / "tests" / "fixtures")]
    env = {**os.environ, "TMPDIR": str(temp), "PYTHONPATH": os.pathsep.join(team)}
    with open(log, "w") as err:
        task = subprocess.Popen([sys.executable, "-c", TASK, json.dumps(settings)], stderr=err, env=env)
    try:
        deadline = time.monotonic() + 300
        while not (out / "metrics.jsonl").exists():  # its first epoch is done
            assert task.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.05)
        step = psutil.Process(task.pid).children(recursive=True)
        task.send_signal(signal.SIGKILL)
        task.wait()
        gone, alive = psutil.wait_procs(step, timeout=60)
        assert not alive, "the step outlived its task by a minute"
    finally:
        if task.poll() is None:
            task.kill()
    assert list((out / "checkpoints").glob("ckpt-*")), "the step checkpointed when its task died"
    # torch's own compile cache (one folder a user, the same every run) is torch's, not the run's
    torch_cache = f"torchinductor_{getpass.getuser()}"
    left = sorted(str(p.relative_to(temp)) for p in temp.rglob("*") if p.relative_to(temp).parts[0] != torch_cache)
    assert not left, f"left in the temp folder: {left}"
