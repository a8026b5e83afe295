"""Preemption: a pod deleted (SIGTERM), Kueue preempting a lower priority, a spot node reclaimed,
Slurm's warning before the time limit (SIGUSR1). The signal goes to train_model's entrypoint as it
would in a container; every rank finishes its step, the ranks write a checkpoint together and the
step exits 75 (retried by the orchestrators); the retry resumes there and ends with the weights of
an uninterrupted run, byte for byte.

A team's function that sleeps 50 ms a step (teampkg.slow) makes an epoch of digits last about a
second, so a signal sent early in the second epoch lands mid-epoch.

The command a person types stops the same way: ``trainpipe train_model`` is the entrypoint itself (no
child that would train on under PID 1), and ``trainpipe run`` takes every process of its run with it,
killed or stopped."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

from tests.conftest import REPO, result_of, run_component

pytestmark = pytest.mark.integration

TEAM = {"PYTHONPATH": str(REPO / "tests" / "fixtures")}
STEPS_PER_EPOCH = 22
#: Kubernetes' default terminationGracePeriodSeconds: a stop slower than this is SIGKILLed and its checkpoint
#: lost. How fast the stop is (the 10 s target) is measured by `make bench`, not here: a test shares the
#: machine's two cores with another worker's, and CI once took over 10 s under that load.
GRACE_S = 30
#: The command a person types, from this environment.
TRAINPIPE = str(Path(sys.executable).parent / "trainpipe")


def args(data: Path, out: Path, server: str, *extra: str, sleep_s: float = 0.05) -> list[str]:
    return [
        "--data",
        str(data),
        "--output-dir",
        str(out),
        "--tracking-uri",
        server,
        "--epochs",
        "2",
        "--batch-size",
        "64",
        "--train-function",
        "teampkg.slow:train",
        "--train-config",
        json.dumps({"sleep_s": sleep_s}),
        *extra,
    ]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, digits_csv, mlflow_server):
    out = tmp_path_factory.mktemp("whole") / "m"
    result_of(run_component("train_model", *args(digits_csv, out, mlflow_server), env=TEAM))
    return out


def preempt(cmd_args: list[str], out: Path, signum: int) -> tuple[subprocess.CompletedProcess, float]:
    """Start train_model, send ``signum`` early in its second epoch; its outcome and the seconds from
    the signal to its exit."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainpipe.components.train_model", *cmd_args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **TEAM},
    )
    deadline = time.monotonic() + 180
    while not (out / "metrics.jsonl").exists():  # the first epoch's line: the second epoch is under way
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
        time.sleep(0.02)
    time.sleep(0.3)
    proc.send_signal(signum)
    t = time.monotonic()
    stdout, stderr = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr), time.monotonic() - t


def test_sigterm_mid_epoch_checkpoints_exits_75_and_the_retry_ends_where_an_uninterrupted_run_ends(
    tmp_path, uninterrupted, digits_csv, mlflow_server
):
    out = tmp_path / "m"
    done, seconds = preempt(args(digits_csv, out, mlflow_server), out, signal.SIGTERM)
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode == 75, done.stderr[-3000:]
    assert seconds < GRACE_S, f"exit 75 took {seconds:.1f} s after SIGTERM"
    assert last.startswith("trainpipe train_model: preempted by SIGTERM at step ") and "Traceback" not in done.stderr
    step = int(last.split("at step ")[1].split(":")[0])
    assert STEPS_PER_EPOCH < step < 2 * STEPS_PER_EPOCH, "the signal was meant to land mid-epoch 2"
    assert f"a retry resumes from ckpt-{step:010d}" in last
    trainer = json.loads((out / "checkpoints" / f"ckpt-{step:010d}" / "trainer.json").read_text())
    assert trainer["global_step"] == step and trainer["carried"], "the partial epoch's sums travel with the checkpoint"
    assert not (out / "model.safetensors").exists()  # nothing half-made is left to be read
    # the orchestrator's retry
    r = result_of(run_component("train_model", *args(digits_csv, out, mlflow_server), env=TEAM))
    assert r["resumed_from_step"] == step and r["global_steps"] == 2 * STEPS_PER_EPOCH
    assert sha256(out / "model.safetensors") == sha256(uninterrupted / "model.safetensors")
    assert (out / "metrics.jsonl").read_text() == (uninterrupted / "metrics.jsonl").read_text()


def test_slurms_warning_sigusr1_stops_horovod_ranks_with_a_checkpoint_and_the_retry_resumes_exactly(
    tmp_path, digits_csv, mlflow_server
):
    """horovodrun would give its ranks five seconds: the launcher signals each rank itself."""
    whole = tmp_path / "whole"
    result_of(run_component("train_model", *args(digits_csv, whole, mlflow_server, "--backend", "horovod"), env=TEAM))
    out = tmp_path / "m"
    done, seconds = preempt(args(digits_csv, out, mlflow_server, "--backend", "horovod"), out, signal.SIGUSR1)
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode == 75 and seconds < GRACE_S, done.stderr[-3000:]
    assert "preempted by SIGUSR1 at step" in last
    r = result_of(run_component("train_model", *args(digits_csv, out, mlflow_server, "--backend", "horovod"), env=TEAM))
    assert r["resumed_from_step"] > STEPS_PER_EPOCH
    assert sha256(out / "model.safetensors") == sha256(whole / "model.safetensors")


def test_a_spent_budget_stops_with_a_checkpoint_exit_9_and_a_larger_one_resumes_exactly(
    tmp_path, uninterrupted, digits_csv, mlflow_server
):
    """A profile priced at one euro per wall second and a max_cost that runs out mid-training: the ranks
    checkpoint at their step's end and the step exits 9 with one line saying what was spent; the same
    budget again starts nothing; a larger one resumes and ends where the uninterrupted run ends, byte
    for byte (the sleep changes the time, not the weights), its cost counting every attempt.

    The steps sleep 0.15 s here: training lasts about 7 s after a start-up whose length the machine's
    load decides. The first budget aims at the middle of that window; one that ran out before the first
    step or after the last (seen on CI with a one-second window) moves two seconds and tries again."""
    from trainpipe.contract.artifacts import read_artifact

    profile = tmp_path / "priced.yaml"
    profile.write_text("name: per-second\nprices: {currency: EUR, node_hour: 3600}\n")
    env = {**TEAM, "TRAINPIPE_HARDWARE_PROFILE": str(profile)}
    steps = 2 * STEPS_PER_EPOCH
    budget = read_artifact(uninterrupted, "model").result["wall_seconds"] + steps * 0.10 - steps * 0.17 / 2
    tried = []
    for attempt in range(4):
        out, budget = tmp_path / f"m{attempt}", round(budget, 2)
        stopped = run_component(
            "train_model", *args(digits_csv, out, mlflow_server, "--max-cost", f"{budget:.2f}", sleep_s=0.15), env=env
        )
        last = stopped.stderr.strip().splitlines()[-1]
        at = int(last.split("stopped at step ")[1].split(" ")[0]) if "stopped at step " in last else 0
        tried.append((budget, stopped.returncode, at))
        if stopped.returncode == 0 or at == steps:  # ran out after the last step
            budget -= 2
        elif stopped.returncode == 9 and at == 0:  # ran out during start-up
            budget += 2
        else:
            break
    print("budget, exit, step of each try:", tried)
    assert stopped.returncode == 9, f"{tried}: {stopped.stderr[-3000:]}"
    assert last.startswith("trainpipe train_model: error: max_cost: spent ") and f"of {budget:g} EUR" in last, last
    assert "a rerun with a larger budget resumes from ckpt-" in last and "Traceback" not in stopped.stderr
    assert 0 < at < steps and not (out / "model.safetensors").exists(), tried
    slow = args(digits_csv, out, mlflow_server, "--max-cost", f"{budget:.2f}", sleep_s=0.15)
    again = run_component("train_model", *slow, env=env)
    assert again.returncode == 9 and "nothing started" in again.stderr.strip().splitlines()[-1], again.stderr[-2000:]
    assert sorted(p.name for p in (out / "checkpoints").glob("ckpt-*")) == [f"ckpt-{at:010d}"]
    larger = args(digits_csv, out, mlflow_server, "--max-cost", "1000", sleep_s=0.15)
    r = result_of(run_component("train_model", *larger, env=env))
    assert r["resumed_from_step"] == at and r["global_steps"] == steps
    assert sha256(out / "model.safetensors") == sha256(uninterrupted / "model.safetensors")
    assert r["cost"] > budget and r["usage"]["wall_seconds"] > r["wall_seconds"]  # both attempts counted


def test_a_budget_spent_before_the_first_step_is_one_line_saying_no_checkpoint_was_written(tmp_path, tiny_csv):
    """Two ranks slow to start (teampkg.early:waits_for_the_stop asks for its first batch once the stop reached
    it, so the stop comes first on any machine) and a budget the first check finds spent: the stop is said once,
    not once per rank, and says nothing was kept."""
    profile = tmp_path / "priced.yaml"
    profile.write_text("name: per-second\nprices: {currency: EUR, node_hour: 3600}\n")
    out = tmp_path / "m"
    stopped = run_component(
        "train_model",
        *("--data", str(tiny_csv), "--label-column", "target", "--output-dir", str(out), "--batch-size", "16"),
        *("--train-function", "teampkg.early:waits_for_the_stop", "--max-cost", "0.01", "--epochs", "1"),
        *("--tracking-uri", f"sqlite:///{tmp_path / 'ml.db'}"),
        env={**TEAM, "TRAINPIPE_HARDWARE_PROFILE": str(profile)},
    )
    assert stopped.returncode == 9, stopped.stderr[-3000:]
    said = [line for line in stopped.stderr.splitlines() if "preempted" in line or "budget" in line or "stop" in line]
    assert len(said) == 1 and said[0].startswith("trainpipe train_model: error: max_cost: spent "), said
    assert said[0].endswith(
        "; stopped at step 0: no checkpoint was written, so a rerun with a larger budget starts over"
    ), said
    assert not list((out / "checkpoints").glob("ckpt-*"))


@pytest.fixture(scope="module")
def mlp_whole(tmp_path_factory, digits_csv, mlflow_server):
    out = tmp_path_factory.mktemp("mlp-whole") / "m"
    result_of(run_component("train_model", *mlp_args(digits_csv, out, mlflow_server)))
    return out


def mlp_args(data: Path, out: Path, server: str) -> list[str]:
    return ["--data", str(data), "--output-dir", str(out), "--tracking-uri", server, "--epochs", "2"]
    # 2 epochs of 1437 training rows at batch 64: 22 steps a epoch, 44 in all (2 gloo ranks)


@pytest.mark.parametrize("step", [1, 22, 43], ids=["first", "epoch-end", "last"])
def test_a_preemption_at_any_step_the_last_included_resumes_to_the_uninterrupted_run(
    tmp_path, mlp_whole, digits_csv, mlflow_server, step
):
    """The platform's SIGTERM taken by every rank before global step ``step`` (the fault's own path, at the
    same step everywhere): exit 75, and the retry ends as an uninterrupted run does. At the last step the
    retry resumed past every batch and then failed to find the epoch history (seen on an H100)."""
    out = tmp_path / "m"
    stopped = run_component(
        "train_model", *mlp_args(digits_csv, out, mlflow_server), env={"TRAINPIPE_FAULT": f"preempt:{step}"}
    )
    assert stopped.returncode == 75, stopped.stderr[-3000:]
    last = stopped.stderr.strip().splitlines()[-1]
    assert "preempted by SIGTERM at step " in last, last
    at = int(last.split("at step ")[1].split(":")[0])  # the next control point (an epoch end, or ~1 s on)
    assert step < at <= 2 * STEPS_PER_EPOCH and (step != 43 or at == 44), last
    again = result_of(run_component("train_model", *mlp_args(digits_csv, out, mlflow_server)))
    assert again["resumed_from_step"] == at and again["global_steps"] == 2 * STEPS_PER_EPOCH
    assert sha256(out / "model.safetensors") == sha256(mlp_whole / "model.safetensors")
    assert (out / "metrics.jsonl").read_text() == (mlp_whole / "metrics.jsonl").read_text()


def _until(proc: subprocess.Popen, ready, log: Path) -> None:
    """Wait until ``ready()`` (an event: a file, a process), failing with the log if ``proc`` ends first."""
    deadline = time.monotonic() + 180
    while not ready():
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.05)


def _outliving(tree: list[psutil.Process], within: float) -> list[str]:
    """The processes of ``tree`` still there after ``within`` seconds (killed then, not to be left to the suite)."""
    _, alive = psutil.wait_procs(tree, timeout=within)
    left = []
    for p in alive:
        with contextlib.suppress(psutil.Error):
            left.append(f"{p.pid} {' '.join(p.cmdline())[:160]}")
            p.kill()
    return left


def test_trainpipe_train_model_killed_takes_its_training_with_it(tmp_path, digits_csv, mlflow_server):
    """SIGKILL to `trainpipe train_model` (a CI job cancelled, a wrapper's timeout): every process under it
    is gone, and nothing trains on (it used to run the entrypoint in a child, which trained to the end)."""
    out, log = tmp_path / "m", tmp_path / "log"
    with open(log, "w") as err:
        cmd = [TRAINPIPE, "train_model", *args(digits_csv, out, mlflow_server), "--epochs", "3"]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env={**os.environ, **TEAM})
    _until(proc, (out / "metrics.jsonl").exists, log)  # the first epoch's line: training is under way
    tree = psutil.Process(proc.pid).children(recursive=True)
    proc.kill()
    proc.wait()
    assert tree and not _outliving(tree, GRACE_S), log.read_text()[-3000:]
    assert not (out / "model.safetensors").exists(), "the training went on after the command was killed"


def test_trainpipe_train_model_sigterm_checkpoints_and_exits_75(tmp_path, digits_csv, mlflow_server):
    out, log = tmp_path / "m", tmp_path / "log"
    with open(log, "w") as err:
        cmd = [TRAINPIPE, "train_model", *args(digits_csv, out, mlflow_server)]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env={**os.environ, **TEAM})
    _until(proc, (out / "metrics.jsonl").exists, log)
    tree = psutil.Process(proc.pid).children(recursive=True)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 75, log.read_text()[-3000:]
    last = log.read_text().strip().splitlines()[-1]
    assert last.startswith("trainpipe train_model: preempted by SIGTERM at step "), last
    step = int(last.split("at step ")[1].split(":")[0])
    assert (out / "checkpoints" / f"ckpt-{step:010d}" / "trainer.json").is_file()
    assert not [p for p in tree if p.is_running()], "a rank outlived the command"


def _run(tmp_path: Path, digits_csv: Path) -> tuple[subprocess.Popen, list[psutil.Process], Path]:
    """`trainpipe run` on kfp-local, once its first step's entrypoint runs: the command, its process tree then
    (the engine, its task process, the step's entrypoint), and its terminal's log."""
    config, log = tmp_path / "pipeline.yaml", tmp_path / "terminal.log"
    settings = {"data": str(digits_csv), "label_column": "label", "workspace": str(tmp_path / "ws")}
    config.write_text(yaml.safe_dump({**settings, "tracking_uri": f"sqlite:///{tmp_path / 'ml.db'}"}))
    with open(log, "w") as err:
        proc = subprocess.Popen([TRAINPIPE, "run", "--config", str(config)], stdout=err, stderr=err)

    def step_runs() -> bool:
        with contextlib.suppress(psutil.Error):
            for p in psutil.Process(proc.pid).children(recursive=True):
                if "trainpipe.components.validate_data" in p.cmdline():
                    return True
        return False

    _until(proc, step_runs, log)
    return proc, psutil.Process(proc.pid).children(recursive=True), log


def test_trainpipe_run_killed_leaves_no_process_of_its_run(tmp_path, digits_csv):
    """SIGKILL to `trainpipe run`: the engine, its task processes and the step they run all end (the engine
    used to run the whole pipeline on under PID 1)."""
    proc, tree, log = _run(tmp_path, digits_csv)
    proc.kill()
    proc.wait()
    left = _outliving(tree, GRACE_S)
    assert not left, f"outlived the command: {left}\n{log.read_text()[-2000:]}"


def test_trainpipe_run_sigterm_stops_every_step_before_it_exits_75(tmp_path, digits_csv):
    """SIGTERM to `trainpipe run` (the same path as a Ctrl-C or a closed terminal): passed on to every step
    (a training checkpoints at its step's end, as the module entrypoint does); the command returns 75 once
    every process of its run has exited."""
    proc, tree, log = _run(tmp_path, digits_csv)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 75, log.read_text()[-3000:]
    assert "trainpipe run: stopped by SIGTERM" in log.read_text()
    assert not [p for p in tree if p.is_running()], "a process of the run outlived the command"
