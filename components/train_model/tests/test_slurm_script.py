"""The sbatch script train_model writes, for a cluster larger than this machine (4 nodes x 8 GPUs), checked
field by field; how a job's end becomes an exit code; the Slurm settings' own checks. No Slurm runs here
(tests/integration/test_slurm.py runs a real one)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from trainpipe.components.train_model import slurm_job
from trainpipe.components.train_model.spec import SlurmJob, TrainModelConfig
from trainpipe.contract.errors import Cancelled, InputError, Preempted, TrainpipeError
from trainpipe.services import slurm
from trainpipe.training import launch

pytestmark = pytest.mark.contract

H100_NODE = {
    "name": "h100-node",
    "train": {
        "cpu_request": "96",
        "cpu_limit": "112",
        "memory_request": "900Gi",
        "memory_limit": "1000Gi",
        "accelerator_type": "nvidia.com/gpu",
        "accelerator_count": 8,
    },
    "secrets_as_env": {"mlflow-creds": {"password": "MLFLOW_TRACKING_PASSWORD"}},
    "train_timeout_s": 3 * 86_400,
}


def _config(tmp_path: Path, **slurm_settings) -> TrainModelConfig:
    profile = tmp_path / "h100.yaml"
    profile.write_text(yaml.safe_dump(H100_NODE))
    (tmp_path / "d.csv").write_text("a,label\n1,0\n")
    return TrainModelConfig(
        data=str(tmp_path / "d.csv"),
        output_dir=str(tmp_path / "out"),
        nnodes=4,
        nproc_per_node=8,
        batch_size=256,
        device="cuda",
        precision="bf16",
        slurm=SlurmJob(profile=str(profile), **slurm_settings),
    )


def test_a_4_node_8_gpu_script_asks_for_what_the_profile_and_settings_say(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "s3cr3t-value")
    config = _config(
        tmp_path,
        partition="gpu",
        account="team-a",
        qos="high",
        signal_s=300,
        setup=["module load cuda/12.4", "source /shared/venvs/trainpipe/bin/activate"],
        sbatch_args=["--constraint=h100", "--exclusive"],
        python="/shared/venvs/trainpipe/bin/python",
    )
    workdir = slurm_job.workdir_of(config)
    job = slurm_job.batch_job(config, workdir, "trainpipe-train-abc", "airflow", "scheduled__2026-11-25")
    assert job.directives() == [
        "--job-name=trainpipe-train-abc",
        "--nodes=4",
        "--ntasks-per-node=1",  # one launcher per node: torchrun's agent starts the 8 ranks
        "--cpus-per-task=96",
        "--mem=1024000M",  # 1000Gi in MiB
        "--gres=gpu:8",
        "--partition=gpu",
        "--account=team-a",
        "--qos=high",
        "--time=3-00:00:00",  # the profile's train_timeout_s
        "--requeue",
        "--signal=USR1@300",
        f"--output={workdir}/slurm-%j.out",
        "--open-mode=append",  # a requeued attempt appends to the same log
        "--export=ALL",
        "--constraint=h100",
        "--exclusive",
    ]
    script = job.script()
    lines = script.splitlines()
    assert lines[0] == "#!/bin/bash" and all(f"#SBATCH {d}" in lines for d in job.directives())
    assert lines.index("module load cuda/12.4") < next(i for i, ln in enumerate(lines) if ln.startswith("srun "))
    srun = next(ln for ln in lines if ln.startswith("srun "))
    assert "--kill-on-bad-exit=1" in srun and "--ntasks-per-node=1" in srun
    assert "/shared/venvs/trainpipe/bin/python" in srun and str(workdir) in srun
    assert "--orchestrator airflow --run-id scheduled__2026-11-25" in srun  # every attempt: one MLflow run
    assert 'scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1' in script  # rendezvous on the first node
    assert "MASTER_PORT=29500" in script
    assert 'if [ "$code" -eq 75 ] && scontrol requeue "$SLURM_JOB_ID"; then exit 0; fi' in lines
    assert "s3cr3t-value" not in script and "MLFLOW_TRACKING_PASSWORD" not in script
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)  # it parses as a shell script

    # what each node runs: the entrypoint, which starts torchrun for 4 nodes with the rendezvous on node 0
    node = slurm_job.node_config(config, workdir)
    assert node.slurm is None and node.nnodes == 4 and node.checkpoint_dir == str(workdir / "checkpoints")
    monkeypatch.setenv("SLURM_NODEID", "3")
    monkeypatch.setenv("MASTER_ADDR", "gpu-a001")
    monkeypatch.setenv("MASTER_PORT", "29500")
    cmd = launch.torchrun_command(node, Path("train.json"))
    assert "--nnodes=4" in cmd and "--node-rank=3" in cmd and "--nproc-per-node=8" in cmd
    assert "--rdzv-backend=c10d" in cmd and "--rdzv-endpoint=gpu-a001:29500" in cmd


def test_without_requeue_a_preempted_job_is_left_to_the_orchestrators_retry(tmp_path):
    config = _config(tmp_path, requeue=False, signal_s=0, time_limit="90")
    job = slurm_job.batch_job(config, slurm_job.workdir_of(config), "j", "slurm", "")
    assert "--no-requeue" in job.directives() and not any(d.startswith("--signal") for d in job.directives())
    assert "--time=90" in job.directives()
    assert "scontrol requeue" not in job.script()
    assert '--orchestrator slurm --run-id "slurm-$SLURM_JOB_ID"' in job.script()


def test_how_a_job_that_did_not_complete_ends_the_step(tmp_path):
    """A node's line comes from the error record its entrypoint wrote (``--error-record``), never from the log."""
    log = tmp_path / "slurm-7.out"
    log.write_text(
        "trainpipe: job 7, attempt 1, nodes a001\n"
        "trainpipe train_model: error: a line in the log that is not the record\n"
        "srun: error: a001: task 0: Exited with exit code 2\n"
    )
    config = _config(tmp_path)
    script = slurm_job.batch_job(config, slurm_job.workdir_of(config), "j", "slurm", "").script()
    assert '--error-record "$1/node$SLURM_NODEID.error.json"' in script
    unexplained = slurm_job.failure(slurm.Job("7", "FAILED", exit_code=2), log)  # no record: the log is named
    assert isinstance(unexplained, InputError) and str(unexplained).startswith("slurm: job 7 failed on bad input (log")
    (tmp_path / "node0.error.json").write_text(
        '{"component": "train_model", "exit_code": 2, "message": "train_config: hidden_units: every width must be '
        'between 1 and 65536"}'
    )
    err = slurm_job.failure(slurm.Job("7", "FAILED", exit_code=2), log)
    assert isinstance(err, InputError) and str(err).startswith("train_config: hidden_units")
    assert isinstance(slurm_job.failure(slurm.Job("7", "FAILED", exit_code=75), log), Preempted)
    for state in ("TIMEOUT", "NODE_FAIL", "PREEMPTED"):
        assert isinstance(slurm_job.failure(slurm.Job("7", state), log), Preempted)
    cancelled = slurm_job.failure(slurm.Job("7", "CANCELLED"), log)  # scancel from outside: its own code, 8
    assert (
        isinstance(cancelled, Cancelled)
        and cancelled.exit_code == 8
        and "cancelled outside trainpipe" in str(cancelled)
    )
    oom = slurm_job.failure(slurm.Job("7", "OUT_OF_MEMORY", exit_code=0, exit_signal=9), log)
    assert isinstance(oom, InputError) and "ran out of memory" in str(oom)
    crashed = slurm_job.failure(slurm.Job("7", "FAILED", exit_code=1), log)  # a bug: the only ending that is 1
    assert type(crashed) is TrainpipeError and crashed.exit_code == 1


def test_a_scontrol_record_is_read_into_its_state_exit_code_and_restarts():
    line = (
        "JobId=12 JobName=trainpipe-train-abc UserId=u(1000) JobState=PENDING Reason=BeginTime Dependency=(null) "
        "Requeue=1 Restarts=2 BatchFlag=1 Reboot=0 ExitCode=75:0 StdOut=/w/slurm-12.out"
    )
    job = slurm.Job.parse(line)
    assert (job.job_id, job.state, job.restarts, job.exit_code, job.reason) == ("12", "PENDING", 2, 75, "BeginTime")
    assert job.active and job.std_out == "/w/slurm-12.out"
    assert not slurm.Job.parse("JobId=3 JobState=COMPLETED ExitCode=0:0").active


@pytest.mark.parametrize(
    ("quantity", "mb"), [("4G", 3815), ("16Gi", 16384), ("512Mi", 512), ("1000Gi", 1024000), ("1.5G", 1431)]
)
def test_memory_quantities_become_slurm_megabytes(quantity, mb):
    assert slurm.memory_mb(quantity) == mb


def test_cpu_and_time_conversions():
    assert [slurm.cpus(q) for q in ("500m", "2", "2500m")] == [1, 2, 3]
    assert [slurm.time_limit(s) for s in (30, 3600, 86_400 + 61)] == ["0-00:01:00", "0-01:00:00", "1-00:02:00"]
    with pytest.raises(InputError, match="memory_limit"):
        slurm.memory_mb("lots")


def test_slurm_settings_refuse_what_sbatch_would_misread(tmp_path):
    with pytest.raises(ValueError, match="slurm: set either slurm or cluster"):
        TrainModelConfig(
            data="d",
            output_dir="o",
            slurm={},
            cluster={"shared_pvc": "p"},
        )
    with pytest.raises(ValueError, match="time_limit"):
        SlurmJob(time_limit="two hours")
    config = _config(tmp_path, sbatch_args=["--comment=fine", "--mail-user=a b"])
    with pytest.raises(InputError, match="slurm.sbatch_args: '--mail-user=a b'"):
        slurm_job.batch_job(config, slurm_job.workdir_of(config), "j", "slurm", "")
