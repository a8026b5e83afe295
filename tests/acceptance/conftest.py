"""The entries of the acceptance matrix, each taken once per session in a dry run.

Every entry runs the same scenario, a team's (:mod:`tests.acceptance.team`): its function with a typed
config holding generated values, a ``tune:`` section on that function, a Feast training set, a priced
hardware profile file with budgets, an alias of its own, drift-gated retraining, optimize_model and an
approval. ``TRAINPIPE_DRY_RUN`` makes each step write what it received and stop (``trainpipe.contract.dry``),
so an entry costs seconds: the engines (``trainpipe run`` on kfp-local and airflow-local), a team's own
KFP pipeline and DAG file, and the components by hand (``trainpipe <component>`` and
``python -m trainpipe.components.<component>``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.acceptance import team as acme
from tests.conftest import seeded

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


@dataclass
class Scenario:
    """What the team wrote: its folder, its settings, and the environment its commands run in."""

    root: Path
    train_config: dict[str, Any]
    profile: Path
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def env(self) -> dict[str, str]:
        path = os.pathsep.join([str(self.root), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        return {**os.environ, "PYTHONPATH": path, "MLFLOW_TRACKING_URI": f"sqlite:///{self.root / 'ws' / 'mlflow.db'}"}

    def config(self, approval: bool = True) -> Path:
        """The pipeline config file (JSON is YAML): every feature on; the approval where the engine can wait."""
        path = self.root / ("pipeline.yaml" if approval else "pipeline-no-approval.yaml")
        path.write_text(json.dumps({**self.settings, "require_approval": approval}, indent=2) + "\n")
        return path


@dataclass
class Records:
    """What each step of one entry's dry run received (:func:`trainpipe.contract.dry.read`)."""

    entry: str
    folder: Path
    log: str = ""
    failed: dict[str, str] = field(default_factory=dict)

    def of(self, component: str) -> list[dict[str, Any]]:
        from trainpipe.contract.dry import read

        return read(self.folder, component)

    def one(self, component: str) -> dict[str, Any]:
        """The step's record (the last, where a retried or mapped step has several)."""
        found = self.of(component)
        if not found and component in self.failed:
            raise AssertionError(f"{self.entry}: {component} failed: {self.failed[component]}")
        assert found, f"{self.entry}: {component} never ran (steps that did: {self.components()})\n{self.log[-3000:]}"
        return found[-1]

    def components(self) -> list[str]:
        return sorted({p.name.rsplit("-", 2)[0] for p in self.folder.glob("*.json")})


@pytest.fixture(scope="session")
def scenario(tmp_path_factory: pytest.TempPathFactory) -> Scenario:
    root = acme.write_package(tmp_path_factory.mktemp("acme"))
    acme.write_table(root / "customers.csv")
    acme.write_feature_repo(root / "feature_repo")
    profile = root / "acme-cpu.yaml"
    profile.write_text(
        "name: acme-cpu-priced\n"
        "train: {cpu_request: '1', cpu_limit: '2', memory_request: 2G, memory_limit: 4G}\n"
        "prices: {currency: EUR, cpu_core_hour: 0.04, node_hour: 0.25}\n"
    )
    train_config = acme.train_config(seeded(44))
    s = Scenario(root=root, train_config=train_config, profile=profile)
    s.settings = {
        "data": "customers.csv",
        "label_column": "churned",
        "workspace": "ws",
        "dataset_name": "acme-churn",
        "features": "churn_training",
        "feature_repo": "feature_repo",
        "entity_timestamp_column": "event_timestamp",
        "model_name": "acme-churn",
        "alias": "prod",
        "thresholds": {"accuracy": 0.5},
        "retrain_on": "drift",
        "drift_share": 0.3,
        "profile": str(profile.name),
        "schedule": None,
        "train": {
            "train_function": acme.FUNCTION,
            "train_config": train_config,
            "epochs": 2,
            "nproc_per_node": 1,
            "batch_size": 16,
            "max_cost": 5,
        },
        "tune": {
            "workers": 2,
            "n_trials": 3,
            "objectives": [{"metric": "churn_loss", "direction": "minimize"}, {"metric": "cost"}],
            "max_cost": 20,
            "space": {
                "train_config.lr": {"type": "float", "low": 0.001, "high": 0.3, "log": True},
                "batch_size": {"type": "categorical", "choices": [16, 32]},
            },
        },
        "optimize": {"enabled": True, "variants": ["onnx", "int8_dynamic"], "max_metric_drop": 0.02},
    }
    return s


def _run(cmd: list[str], env: dict[str, str], cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)


def _dry_env(s: Scenario, entry: str, **more: str) -> tuple[dict[str, str], Path]:
    folder = s.root / f"dry-{entry}"
    return {**s.env, "TRAINPIPE_DRY_RUN": str(folder), **more}, folder


def engine(s: Scenario, name: str) -> Records:
    """``trainpipe run --config pipeline.yaml --engine <name> --dry-run``, as the README shows it."""
    # dag.test() cannot answer a person's approval: the Airflow entry runs without it (its cell says where it is run)
    config = s.config(approval=name == "kfp-local")
    workspace = s.root / "ws" / name
    written = json.loads(config.read_text())
    config.write_text(json.dumps({**written, "workspace": str(workspace)}, indent=2) + "\n")
    proc = _run([str(BIN / "trainpipe"), "run", "--config", str(config), "--engine", name, "--dry-run"], s.env, s.root)
    # a step that failed leaves the others' records: each cell asks for the steps it needs
    folders = sorted((workspace / "dry-run").glob("*"))
    return Records(name, folders[-1] if folders else workspace / "dry-run" / "none", proc.stdout + proc.stderr)


def by_hand(s: Scenario, entry: str) -> Records:
    """Each step by hand, as the components' READMEs show it: ``trainpipe <component>`` or
    ``python -m trainpipe.components.<component>``, the profile in ``TRAINPIPE_HARDWARE_PROFILE``."""
    env, folder = _dry_env(s, entry, TRAINPIPE_HARDWARE_PROFILE=str(s.profile))
    train = s.settings["train"]
    tune = s.settings["tune"]
    trust = json.dumps([acme.PACKAGE])

    records = Records(entry, folder)

    def step(component: str, *flags: str) -> None:
        head = (
            [str(BIN / "trainpipe"), component]
            if entry == "cli"
            else [sys.executable, "-m", f"trainpipe.components.{component}"]
        )
        proc = _run([*head, *flags], env, s.root)
        if proc.returncode != 0:  # the later steps still run: each cell asks for the steps it needs
            records.failed[component] = f"exit {proc.returncode}: {proc.stderr.strip()[-2000:]}"

    out = s.root / f"out-{entry}"
    step(
        "validate_data",
        "--data",
        "customers.csv",
        "--output-dir",
        f"{out}/validated",
        "--label-column",
        "churned",
        "--features",
        "churn_training",
        "--feature-repo",
        "feature_repo",
        "--entity-timestamp-column",
        "event_timestamp",
    )
    step(
        "snapshot_dataset",
        "--data",
        f"{out}/validated",
        "--output-dir",
        f"{out}/snapshot",
        "--repo-dir",
        "ws/dvc-repo",
        "--remote-url",
        "ws/dvc-remote",
        "--dataset-name",
        "acme-churn",
    )
    step(
        "detect_drift",
        "--data",
        f"{out}/snapshot",
        "--output-dir",
        f"{out}/drift",
        "--model-name",
        "acme-churn",
        "--alias",
        "prod",
        "--drift-share",
        "0.3",
        "--trusted-packages",
        trust,
    )
    step(
        "tune_model",
        "--data",
        f"{out}/snapshot",
        "--output-dir",
        f"{out}/tune",
        "--label-column",
        "churned",
        "--train",
        json.dumps({k: v for k, v in train.items() if k not in tune["space"]}),  # a dimension is set in one place
        "--space",
        json.dumps(tune["space"]),
        "--objectives",
        json.dumps(tune["objectives"]),
        "--n-trials",
        "3",
        "--max-cost",
        "20",
    )
    step(
        "train_model",
        "--data",
        f"{out}/snapshot",
        "--output-dir",
        f"{out}/model",
        "--label-column",
        "churned",
        "--train-function",
        acme.FUNCTION,
        "--train-config",
        json.dumps(s.train_config),
        "--epochs",
        "2",
        "--nproc-per-node",
        "1",
        "--max-cost",
        "5",
        # the study's best laid over them; where the study failed (its own cells say why), the settings as written
        *(["--tuned", f"{out}/tune"] if "tune_model" not in records.failed else []),
    )
    step("profile_training", "--model", f"{out}/model", "--output-dir", f"{out}/profile")
    step(
        "evaluate_model",
        "--model",
        f"{out}/model",
        "--data",
        f"{out}/snapshot",
        "--output-dir",
        f"{out}/eval",
        "--model-name",
        "acme-churn",
        "--alias",
        "prod",
        "--thresholds",
        '{"accuracy": 0.5}',
        "--trusted-packages",
        trust,
    )
    step(
        "optimize_model",
        "--model",
        f"{out}/model",
        "--data",
        f"{out}/snapshot",
        "--output-dir",
        f"{out}/optimized",
        "--variants",
        '["onnx", "int8_dynamic"]',
        "--max-metric-drop",
        "0.02",
        "--trusted-packages",
        trust,
    )
    step(
        "register_model",
        "--model",
        f"{out}/model",
        "--decision",
        f"{out}/eval",
        "--optimized",
        f"{out}/optimized",
        "--training-profile",
        f"{out}/profile",
        "--output-dir",
        f"{out}/registered",
        "--model-name",
        "acme-churn",
        "--alias",
        "prod",
        "--move-alias",
        "false",
    )
    return records


TEAM_PIPELINE = '''
"""The team's own KFP pipeline of trainpipe's faces (README: "Use one component in your own KFP pipeline")."""
import sys

from kfp import dsl, local
from kfp.dsl import Dataset

from trainpipe.components.evaluate_model.kfp_component import evaluate_model
from trainpipe.components.register_model.kfp_component import register_model
from trainpipe.components.snapshot_dataset.kfp_component import snapshot_dataset
from trainpipe.components.train_model.kfp_component import train_model
from trainpipe.components.validate_data.kfp_component import validate_data

TRAIN_CONFIG = {train_config}


@dsl.pipeline(name="acme-churn")
def acme_churn(data_uri: str, lr: float = 0.05):
    raw = dsl.importer(artifact_uri=data_uri, artifact_class=Dataset)
    checked = validate_data(
        data=raw.output, label_column="churned", features="churn_training", feature_repo="{root}/feature_repo",
        entity_timestamp_column="event_timestamp",
    )
    snap = snapshot_dataset(data=checked.outputs["validated"], repo_dir="{root}/ws/dvc-repo",
                            remote_url="{root}/ws/dvc-remote")
    trained = train_model(
        data=snap.outputs["snapshot"], label_column="churned", train_function="{function}",
        train_config={{**TRAIN_CONFIG, "lr": lr}}, epochs=2, nproc_per_node=1, max_cost=5.0,
    )
    trained.set_env_variable(name="TRAINPIPE_HARDWARE_PROFILE", value="{profile}")
    judged = evaluate_model(model=trained.outputs["model"], data=snap.outputs["snapshot"], model_name="acme-churn",
                            alias="prod", thresholds={{"accuracy": 0.5}}, trusted_packages=["acme"])
    register_model(model=trained.outputs["model"], decision=judged.outputs["decision"], model_name="acme-churn",
                   alias="prod")


if __name__ == "__main__":
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=sys.argv[2])
    acme_churn(data_uri=sys.argv[1], lr=0.05)
'''


def team_kfp(s: Scenario) -> Records:
    """The team's own KFP pipeline (the faces, a dict train_config holding a pipeline parameter), on kfp.local."""
    env, folder = _dry_env(s, "team-kfp")
    source = TEAM_PIPELINE.format(
        train_config=repr({k: v for k, v in s.train_config.items() if k != "lr"}),
        function=acme.FUNCTION,
        profile=s.profile,
        root=s.root,
    )
    path = s.root / "acme_pipeline.py"
    path.write_text(textwrap.dedent(source))
    root = s.root / "kfp-root"
    proc = _run([sys.executable, str(path), str(s.root / "customers.csv"), str(root)], env, s.root)
    return Records("team-kfp", folder, proc.stderr)


TEAM_DAG = '''
"""The team's own DAG of trainpipe's operators (README: "Use one component in your own Airflow DAG")."""
from datetime import datetime

from airflow.sdk import DAG

from trainpipe.components.evaluate_model.airflow_task import EvaluateModelOperator
from trainpipe.components.register_model.airflow_task import RegisterModelOperator
from trainpipe.components.snapshot_dataset.airflow_task import SnapshotDatasetOperator
from trainpipe.components.train_model.airflow_task import TrainModelOperator
from trainpipe.components.validate_data.airflow_task import ValidateDataOperator

ROOT = "{root}"
RUN = ROOT + "/dag-runs/{{{{ run_id | replace(':', '_') | replace('+', '_') }}}}"

with DAG(dag_id="acme_churn", start_date=datetime(2026, 1, 1), schedule=None, render_template_as_native_obj=True,
         params={{"lr": 0.05}}) as dag:
    validate = ValidateDataOperator(task_id="validate_data", settings={{
        "data": ROOT + "/customers.csv", "output_dir": RUN + "/validated", "label_column": "churned",
        "features": "churn_training", "feature_repo": ROOT + "/feature_repo",
        "entity_timestamp_column": "event_timestamp"}})
    snapshot = SnapshotDatasetOperator(task_id="snapshot_dataset", settings={{
        "data": RUN + "/validated", "output_dir": RUN + "/snapshot", "repo_dir": ROOT + "/ws/dvc-repo",
        "remote_url": ROOT + "/ws/dvc-remote"}})
    train = TrainModelOperator(task_id="train_model", settings={{
        "data": RUN + "/snapshot", "output_dir": RUN + "/model", "label_column": "churned",
        "train_function": "{function}", "train_config": {{**{train_config}, "lr": "{{{{ params.lr }}}}"}},
        "epochs": 2, "nproc_per_node": 1, "max_cost": 5.0}}, env={{"TRAINPIPE_HARDWARE_PROFILE": "{profile}"}})
    evaluate = EvaluateModelOperator(task_id="evaluate_model", settings={{
        "model": RUN + "/model", "data": RUN + "/snapshot", "output_dir": RUN + "/eval", "model_name": "acme-churn",
        "alias": "prod", "thresholds": {{"accuracy": 0.5}}, "trusted_packages": ["acme"]}})
    register = RegisterModelOperator(task_id="register_model", settings={{
        "model": RUN + "/model", "decision": RUN + "/eval", "output_dir": RUN + "/registered",
        "model_name": "acme-churn", "alias": "prod"}})
    validate >> snapshot >> train >> evaluate >> register

if __name__ == "__main__":
    run = dag.test()
    raise SystemExit(0 if str(run.state).endswith("success") else 1)
'''


def team_dag(s: Scenario) -> Records:
    """The team's own DAG file in its dags folder, run by ``dag.test()`` (the file must be in the dags folder)."""
    env, folder = _dry_env(s, "team-dag")
    dags = s.root / "dags"
    dags.mkdir(exist_ok=True)
    source = TEAM_DAG.format(
        root=s.root,
        function=acme.FUNCTION,
        train_config=repr({k: v for k, v in s.train_config.items() if k != "lr"}),
        profile=s.profile,
    )
    path = dags / "acme_dag.py"
    path.write_text(textwrap.dedent(source))
    home = s.root / "airflow-home"
    env.update(
        {
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
        }
    )
    home.mkdir(exist_ok=True)
    migrate = _run([str(BIN / "airflow"), "db", "migrate"], env, s.root)
    assert migrate.returncode == 0, migrate.stderr[-3000:]
    proc = _run([sys.executable, str(path)], env, s.root)
    return Records("team-dag", folder, proc.stderr)


def tune_trial(s: Scenario) -> Records:
    """What tune_model's trials would train (its baseline and a sampled trial), by hand under the priced profile."""
    env, folder = _dry_env(s, "tune-trial", TRAINPIPE_HARDWARE_PROFILE=str(s.profile))
    tune, train = s.settings["tune"], s.settings["train"]
    out = s.root / "out-tune-trial"
    made = by_hand_snapshot(s, out, env)
    proc = _run(
        [
            sys.executable,
            "-m",
            "trainpipe.components.tune_model",
            "--data",
            str(made),
            "--output-dir",
            f"{out}/tune",
            "--label-column",
            "churned",
            "--space",
            json.dumps(tune["space"]),
            "--objectives",
            json.dumps(tune["objectives"]),
            "--train",
            json.dumps({k: v for k, v in train.items() if k not in tune["space"]}),
        ],
        env,
        s.root,
    )
    records = Records("tune-trial", folder, proc.stderr)
    if proc.returncode != 0:
        records.failed["tune_model"] = f"exit {proc.returncode}: {proc.stderr.strip()[-2000:]}"
    return records


def by_hand_snapshot(s: Scenario, out: Path, env: dict[str, str]) -> Path:
    """A dry snapshot of the team's data, for a step that needs one."""
    for component, flags in (
        ("validate_data", ["--data", "customers.csv", "--output-dir", f"{out}/validated", "--label-column", "churned"]),
        (
            "snapshot_dataset",
            [
                "--data",
                f"{out}/validated",
                "--output-dir",
                f"{out}/snapshot",
                "--repo-dir",
                "ws/r",
                "--remote-url",
                "ws/rr",
            ],
        ),
    ):
        proc = _run([sys.executable, "-m", f"trainpipe.components.{component}", *flags], env, s.root)
        assert proc.returncode == 0, proc.stderr[-2000:]
    return out / "snapshot"


@dataclass
class Receipts:
    """What the team's function actually received in one real run (``acme.churn.train:receipt``, a file a call)."""

    entry: str
    folder: Path
    log: str = ""
    #: a study's trials: what the sampler drew for each (its train_config keys), from the study's own storage
    sampled: dict[int, dict[str, Any]] = field(default_factory=dict)

    def _found(self) -> list[dict[str, Any]]:
        return [json.loads(p.read_text(encoding="utf-8")) for p in sorted(self.folder.glob("*.json"))]

    def training(self) -> dict[str, Any]:
        """The receipt of train_model's call (a study's trials write theirs from ``trial-<n>`` folders)."""
        got = [r for r in self._found() if not Path(r["output_dir"]).name.startswith("trial-")]
        assert got, f"{self.entry}: the real run's train_model never called the team's function\n{self.log[-3000:]}"
        return got[-1]

    def trial(self, number: int) -> dict[str, Any]:
        """The receipt of a study's trial ``number`` (0: the baseline), with what the sampler drew for it under
        ``sampled``: the one thing a dry record cannot know."""
        got = [r for r in self._found() if Path(r["output_dir"]).name == f"trial-{number:04d}"]
        never = f"{self.entry}: the real study's trial {number} never called the team's function"
        assert got, f"{never}\n{self.log[-3000:]}"
        unread = f"{self.entry}: the real study ended without a record of trial {number}'s sampled values"
        assert number == 0 or number in self.sampled, f"{unread}\n{self.log[-3000:]}"
        return {**got[-1], "sampled": self.sampled.get(number, {})}

    def of(self, which: str) -> dict[str, Any]:
        """The receipt a dry record describes: ``train_model``'s, or a study's ``baseline`` or (first sampled)
        ``trial``."""
        return self.training() if which == "train_model" else self.trial({"baseline": 0, "trial": 1}[which])


def real_engine(s: Scenario, name: str) -> Receipts:
    """``trainpipe run --engine <name>`` for real on the scenario's train section, once per session and engine:
    its function records what it received (:class:`Receipts`) for the cells that read the dry record.

    Kept cheap and runnable here: 1 epoch on 96 rows, one rank; no Feast join (nothing is applied to the
    scenario's feature repository), no optimize_model, no approval, no tune. With a ``tune:`` section
    train_model takes the study's best settings file, tune's own copy of the train section; without one it
    takes the DAG's ``train`` param, rendered by a template, the path a dry record alone cannot vouch for.
    Either way train_model is handed the train section as written: the dry record's is the study's baseline.
    """
    root = s.root / f"real-{name}"
    root.mkdir(exist_ok=True)
    table = (s.root / "customers.csv").read_text().splitlines()
    (root / "customers.csv").write_text("\n".join(",".join(line.split(",")[2:]) for line in table) + "\n")
    drop = ("features", "feature_repo", "entity_timestamp_column", "tune", "optimize")
    settings = {k: v for k, v in s.settings.items() if k not in drop}
    settings.update(
        data=str(root / "customers.csv"),
        workspace=str(root / "ws"),
        profile=str(s.profile),
        retrain_on="always",
        require_approval=False,
        train={**s.settings["train"], "epochs": 1},
    )
    config = root / "pipeline.yaml"
    config.write_text(json.dumps(settings, indent=2) + "\n")
    receipts = root / "receipts"
    env = {**s.env, "MLFLOW_TRACKING_URI": f"sqlite:///{root / 'mlflow.db'}", "ACME_RECEIPTS": str(receipts)}
    proc = _run([str(BIN / "trainpipe"), "run", "--config", str(config), "--engine", name], env, s.root, timeout=900)
    return Receipts(name, receipts, f"exit {proc.returncode}\n{proc.stdout}{proc.stderr}")


def real_tune(s: Scenario, engine_run: Receipts | None) -> Receipts:
    """tune_model for real on the scenario's tune section, by hand, once per session: its baseline trial (the
    train section as written) and one sampled trial, the function recording what each received
    (:class:`Receipts`), for the cells that read what a trial receives.

    Kept cheap: on the snapshot the real kfp-local run made (96 rows), 1 epoch, one rank, 2 trials, one worker,
    under the priced profile (cost is an objective). What the sampler drew for each trial is read from the
    study's storage, not from what trainpipe handed the trial, so a value re-typed on its way still differs.
    """
    assert engine_run is not None
    markers = [
        p
        for p in sorted(engine_run.folder.parent.rglob("trainpipe.json"))
        if json.loads(p.read_text(encoding="utf-8")).get("component") == "snapshot_dataset"
    ]
    assert markers, f"tune-trial: the real kfp-local run made no snapshot to tune on\n{engine_run.log[-3000:]}"
    root = s.root / "real-tune"
    root.mkdir(exist_ok=True)
    tune, train = s.settings["tune"], s.settings["train"]
    section = {k: v for k, v in {**train, "epochs": 1}.items() if k not in tune["space"]}
    flags = {
        "--data": str(markers[-1].parent),
        "--output-dir": str(root / "tune"),
        "--label-column": s.settings["label_column"],
        "--train": json.dumps(section),
        "--space": json.dumps(tune["space"]),
        "--objectives": json.dumps(tune["objectives"]),
        "--n-trials": "2",
        "--max-cost": str(tune["max_cost"]),
    }
    receipts = root / "receipts"
    env = {
        **s.env,
        "MLFLOW_TRACKING_URI": f"sqlite:///{root / 'mlflow.db'}",
        "ACME_RECEIPTS": str(receipts),
        "TRAINPIPE_HARDWARE_PROFILE": str(s.profile),
    }
    cmd = [sys.executable, "-m", "trainpipe.components.tune_model", *(x for kv in flags.items() for x in kv)]
    proc = _run(cmd, env, s.root)
    done = Receipts("tune-trial", receipts, f"exit {proc.returncode}\n{proc.stdout}{proc.stderr}")
    if proc.returncode == 0:
        import optuna

        study = optuna.load_study(study_name=None, storage=f"sqlite:///{root / 'tune' / 'study.db'}")
        done.sampled = {
            t.number: {k.removeprefix("train_config."): v for k, v in t.params.items() if k.startswith("train_config.")}
            for t in study.get_trials(deepcopy=False)
        }
    return done


#: The real runs the dry records are checked against: each engine's, and a study's trials (``tune-trial``: on
#: the real kfp-local run's snapshot). Each is called with the scenario and the fixture's getter.
REAL: dict[str, Callable[[Scenario, Callable[[str], Receipts | None]], Receipts]] = {
    "kfp-local": lambda s, real: real_engine(s, "kfp-local"),
    "airflow-local": lambda s, real: real_engine(s, "airflow-local"),
    "tune-trial": lambda s, real: real_tune(s, real("kfp-local")),
}


@pytest.fixture(scope="session")
def received(scenario: Scenario):
    """Each real run, taken the first time a cell asks for it (once per session), or None: the entry has no
    real run here."""
    done: dict[str, Receipts] = {}

    def get(entry: str) -> Receipts | None:
        if entry not in REAL:
            return None
        if entry not in done:
            done[entry] = REAL[entry](scenario, get)
        return done[entry]

    return get


RUNNERS = {
    "kfp-local": lambda s: engine(s, "kfp-local"),
    "airflow-local": lambda s: engine(s, "airflow-local"),
    "cli": lambda s: by_hand(s, "cli"),
    "module": lambda s: by_hand(s, "module"),
    "team-kfp": team_kfp,
    "team-dag": team_dag,
    "tune-trial": tune_trial,
}


@pytest.fixture(scope="session")
def entries(scenario: Scenario):
    """Each entry's dry run, taken the first time a cell asks for it (once per session)."""
    done: dict[str, Records] = {}
    failed: dict[str, str] = {}

    def get(entry: str) -> Records:
        if entry in failed:
            pytest.fail(failed[entry], pytrace=False)
        if entry not in done:
            try:
                done[entry] = RUNNERS[entry](scenario)
            except AssertionError as exc:
                failed[entry] = str(exc)
                raise
        return done[entry]

    return get
