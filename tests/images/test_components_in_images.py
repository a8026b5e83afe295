"""Each component's entrypoint in the image ``make images`` built, as a pod runs it: the image's non-root user,
a read-only root filesystem, no network, the data and outputs on mounted folders, tracking in a SQLite store
on the mounted folder.

- every component the image serves answers ``--help`` and refuses a setting its spec lacks in one line with
  exit 2;
- the six steps of the reference pipeline do their real work on the digits, chained by hand, and the model
  registers with its lineage;
- train_model stopped (SIGTERM, as a pod's deletion) writes a checkpoint and exits 75;
- a component writes nothing outside its mounted output (the container's own changes, read back by podman).
"""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.images.conftest import TIMEOUT_S, podman, podman_env, run_in, writable

pytestmark = pytest.mark.images

OUT = "/work"
DB = f"sqlite:///{OUT}/mlflow.db"
IMAGES_OF = {"cpu": "cpu_image", "data": "data_image"}


def _result(proc: subprocess.CompletedProcess) -> dict:
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def cpu_ref() -> str:
    from trainpipe.services.images import reference

    return reference("cpu")


def _served(kind: str) -> tuple[str, ...]:
    from trainpipe.services.images import IMAGES

    return IMAGES[kind].components


@pytest.mark.parametrize("kind", ["data", "cpu"])
def test_every_component_the_image_serves_answers_help_and_refuses_an_unknown_setting_in_one_line(
    kind, request, tmp_path
):
    """One container per component and question: each starts a fresh interpreter that imports the component's
    heavy libraries for its checks (about 10 s each on two cores)."""
    from tests.helpers.component_contract import config_model
    from trainpipe.contract.entrypoint import input_fields, output_fields

    image = request.getfixturevalue(IMAGES_OF[kind])
    for name in _served(kind):
        shown = run_in(image, "python", "-m", f"trainpipe.components.{name}", "--help")
        assert shown.returncode == 0 and "--output-dir" in shown.stdout, (name, shown.stderr[-2000:])
        config = config_model(name)
        paths = set(input_fields(config)) | set(output_fields(config))
        required = {n: f"{OUT}/{n}" if n in paths else "x" for n, f in config.model_fields.items() if f.is_required()}
        folder = writable(tmp_path / name)
        (folder / "settings.json").write_text(json.dumps({**required, "no_such_setting": 1}))
        refused = run_in(
            image,
            "python",
            "-m",
            f"trainpipe.components.{name}",
            "--config",
            f"{OUT}/settings.json",
            mounts={folder: OUT},
        )
        errors = [line for line in refused.stderr.splitlines() if line.startswith(f"trainpipe {name}: error: ")]
        assert refused.returncode == 2, (name, refused.stderr[-2000:])
        assert len(errors) == 1 and "no_such_setting" in errors[0] and "Traceback" not in refused.stderr, name
        assert sorted(p.name for p in folder.iterdir()) == ["settings.json"], f"{name} began an output"


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    """The mounted folder of the chain by hand: the digits, the DVC repository and remote, the MLflow store."""
    from trainpipe.demo import write_digits

    root = writable(tmp_path_factory.mktemp("chain") / "work")
    write_digits(root / "digits.csv").chmod(0o644)
    return root


@pytest.fixture(scope="module")
def chain(cpu_image, data_image, work) -> dict[str, dict]:
    """validate → snapshot (the data image) → drift → train → evaluate → register (the cpu image), each in its
    own container on the mounted folder, with the settings the pipeline passes. Slow on purpose: six containers
    that import GX, DVC, torch and MLflow, and a training of two epochs on the digits."""

    def step(image: str, name: str, **settings) -> dict:
        flags = [a for k, v in settings.items() for a in ("--" + k.replace("_", "-"), str(v))]
        proc = run_in(
            image, "python", "-m", f"trainpipe.components.{name}", "--output-dir", f"{OUT}/{name}", *flags,
            mounts={work: OUT},
        )  # fmt: skip
        return _result(proc)

    track = {"tracking_uri": DB}
    snap = f"{OUT}/snapshot_dataset"
    model = f"{OUT}/train_model"
    return {
        "validate_data": step(data_image, "validate_data", data=f"{OUT}/digits.csv", label_column="label"),
        "snapshot_dataset": step(
            data_image,
            "snapshot_dataset",
            data=f"{OUT}/validate_data",
            repo_dir=f"{OUT}/dvc-repo",
            remote_url=f"{OUT}/dvc-remote",
            dataset_name="digits",
        ),
        "detect_drift": step(cpu_image, "detect_drift", data=snap, label_column="label", model_name="digits", **track),
        "train_model": step(
            cpu_image,
            "train_model",
            data=snap,
            label_column="label",
            epochs=2,
            batch_size=64,
            nproc_per_node=2,
            experiment_name="images",
            **track,
        ),  # fmt: skip
        "evaluate_model": step(
            cpu_image,
            "evaluate_model",
            model=model,
            data=snap,
            label_column="label",
            model_name="digits",
            thresholds=json.dumps({"accuracy": 0.8}),
            **track,
        ),  # fmt: skip
        "register_model": step(
            cpu_image, "register_model", model=model, decision=f"{OUT}/evaluate_model", model_name="digits", **track
        ),
    }


def test_the_six_steps_run_in_their_images_and_register_the_model_with_its_lineage(chain, work):
    import mlflow

    assert chain["detect_drift"]["retrain"] is True  # no champion yet
    assert chain["evaluate_model"]["decision"]["passed"] is True, chain["evaluate_model"]
    client = mlflow.MlflowClient(f"sqlite:///{work / 'mlflow.db'}")
    version = client.get_model_version_by_alias("digits", "champion")
    assert str(version.version) == "1"
    tags = version.tags
    assert chain["snapshot_dataset"]["md5"] in tags.values(), tags  # the data's hash travels to the registry
    assert tags["lineage.image"] == cpu_ref(), tags  # and the image that made the model


def test_train_model_stopped_by_sigterm_checkpoints_and_exits_75(cpu_image, work):
    """The pod's deletion: ``podman kill --signal TERM`` to the container, whose PID 1 is the entrypoint."""
    out = writable(work.parent / "preempted")
    name = f"trainpipe-sigterm-{uuid.uuid4().hex[:8]}"
    proc = subprocess.Popen(
        ["podman", "run", "--rm", "--network", "none", "--read-only", "--name", name]
        + ["--volume", f"{work}:/data:ro", "--volume", f"{out}:{OUT}"]
        + ["--volume", f"{REPO / 'tests' / 'fixtures'}:/team:ro", "--env", "PYTHONPATH=/team", cpu_image]
        + ["python", "-m", "trainpipe.components.train_model", "--data", "/data/snapshot_dataset"]
        + ["--output-dir", f"{OUT}/m", "--tracking-uri", DB, "--epochs", "2", "--batch-size", "64"]
        + ["--train-function", "teampkg.slow:train", "--train-config", json.dumps({"sleep_s": 0.05})],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=podman_env(),
    )
    deadline = time.monotonic() + TIMEOUT_S
    while not (out / "m" / "metrics.jsonl").exists():  # the first epoch's line: the second epoch is under way
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
        time.sleep(0.05)
    podman("kill", "--signal", "TERM", name)
    _, stderr = proc.communicate(timeout=120)
    last = stderr.strip().splitlines()[-1]
    assert proc.returncode == 75, stderr[-3000:]
    assert last.startswith("trainpipe train_model: preempted by SIGTERM at step "), last
    step = int(last.split("at step ")[1].split(":")[0])
    assert (out / "m" / "checkpoints" / f"ckpt-{step:010d}" / "trainer.json").is_file()


def _changes(image: str, command: list[str], mounts: dict[Path, str]) -> tuple[subprocess.CompletedProcess, set[str]]:
    """The command's run, and what it changed in the container's filesystem (``podman diff``), with a writable
    root filesystem so that a stray write would succeed and show."""
    name = f"trainpipe-diff-{uuid.uuid4().hex[:8]}"
    try:
        proc = run_in(image, *command, mounts=mounts, name=name, rm=False, read_only=False)
        changed = {line.split(maxsplit=1)[1] for line in podman("diff", name).stdout.splitlines() if line.strip()}
    finally:
        podman("rm", "--force", name, check=False)
    return proc, changed


def test_a_component_writes_nothing_outside_its_mounted_output(data_image, work, tmp_path):
    """Compared with a container that runs nothing (podman itself adds the mount points and /etc's entries)."""
    out = writable(tmp_path / "out")
    mounts = {work: "/data:ro", out: OUT}
    _, podmans_own = _changes(data_image, ["python", "-c", "pass"], mounts)
    proc, changed = _changes(
        data_image,
        ["python", "-m", "trainpipe.components.validate_data", "--data", "/data/digits.csv", "--label-column", "label"]
        + ["--output-dir", f"{OUT}/v"],
        mounts,
    )
    _result(proc)
    assert {p for p in changed - podmans_own if p != "/tmp" and not p.startswith("/tmp/")} == set(), changed
    assert (out / "v").is_dir()
