"""The acceptance matrix: each feature the docs name x each entry a user takes, declared once.

A cell is one of:

- a check (a function of the entry's dry-run records and the scenario): what the step received on that
  entry, from what the team wrote (``tests/acceptance/conftest.py`` runs each entry once per session); a check
  in :data:`READ_RECEIVED` is also held to what the team's function received in a real run (one per engine
  and session for train_model's record; one real study per session for what tune_model's trials train);
- :class:`RunFor` a test elsewhere that runs that cell for real (a training, a Slurm job, a study): the node
  id is checked to exist, so the reference cannot rot;
- :class:`NA`: the feature has no meaning on that entry, and why.

``test_matrix.py`` generates one test per cell. A feature added to the docs is a row here; a row without a
cell for every entry fails (``test_every_cell_is_declared``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tests.acceptance import team as acme

#: The entries a user takes, as the docs name them.
ENTRIES = {
    "kfp-local": "the pipeline config, `trainpipe run --engine kfp-local`",
    "airflow-local": "the pipeline config, `trainpipe run --engine airflow-local` (the reference DAG)",
    "cli": "`trainpipe <component>` by hand",
    "module": "`python -m trainpipe.components.<component>` (the container entrypoint)",
    "team-kfp": "a team's own KFP pipeline of the faces",
    "team-dag": "a team's own Airflow DAG file of the operators",
    "tune-trial": "a training tune_model runs as a trial",
    "slurm": "a training submitted as a Slurm job",
}

#: The features the docs name.
FEATURES = {
    "team-function": "a team's training function with a typed config (README: Train your own model)",
    "key-order": "train_config arrives with its values, types and key order (README: What you write arrives)",
    "tune": "a tune: section searches the train function's settings (README, docs/configuration.md)",
    "feature-set": "a training set from a Feast feature service (README: Training sets from a feature store)",
    "priced-profile": "a hardware profile file with prices, and budgets (README: What every run cost)",
    "alias": "a serving alias of the team's own (docs/configuration.md: alias)",
    "trust": "the steps that rebuild the model trust the team's package (README: Trusting your model's code)",
    "drift": "drift-gated retraining (README: Data-aware retraining)",
    "optimize": "optimize_model after the gate (components/optimize_model/README.md)",
    "approval": "a person approves before the alias moves (docs/configuration.md: require_approval)",
    "slurm": "training as a Slurm batch job (components/train_model/README.md: Slurm)",
}


@dataclass(frozen=True)
class NA:
    """The feature has no meaning on this entry."""

    why: str


@dataclass(frozen=True)
class RunFor:
    """Run for real by another test (``path::name``), which asserts what this cell asks."""

    test: str
    asserts: str


Check = Callable[[Any, Any, str], None]


# --- what the team wrote, as each entry writes it -------------------------------------------------------------


def written_train_config(scenario: Any, entry: str) -> dict[str, Any]:
    """The train_config as the team wrote it on ``entry`` (its own KFP pipeline and DAG set ``lr`` from a
    parameter, last)."""
    if entry in ("team-kfp", "team-dag"):
        return {**{k: v for k, v in scenario.train_config.items() if k != "lr"}, "lr": 0.05}
    return scenario.train_config


def trained(records: Any, scenario: Any, entry: str) -> dict[str, Any]:
    """What the training step received, and the train_config it would hand the function."""
    return records.one("train_model")["received"]


# --- the checks --------------------------------------------------------------------------------------------------


def team_function(records: Any, scenario: Any, entry: str) -> None:
    got = trained(records, scenario, entry)
    assert got["train_function"] == acme.FUNCTION
    if entry in ("kfp-local", "airflow-local", "cli", "module"):  # tune's best laid over it: the lr may move
        assert {k: v for k, v in got["train_config"].items() if k != "lr"} == {
            k: v for k, v in scenario.train_config.items() if k != "lr"
        }
    else:
        assert got["train_config"] == written_train_config(scenario, entry)


def key_order(records: Any, scenario: Any, entry: str) -> None:
    got = trained(records, scenario, entry)["train_config"]
    want = written_train_config(scenario, entry)
    assert list(got) == list(want), f"train_config's keys arrive as {list(got)}, written as {list(want)}"
    assert acme.same_order(got["tags"], want["tags"]), (
        f"nested keys reordered on {entry}:\n written {want['tags']}\n arrived {got['tags']}"
    )


def dry_configs(records: Any, which: str) -> list[dict[str, Any]]:
    """The train_config(s) a dry record says the team's function receives: train_model's (``train_model``), or
    what tune_model's trials would train (``baseline``: the train section as given; ``trial``: a sampled one),
    one per tune_model step (an engine runs several workers)."""
    if which == "train_model":
        return [records.one("train_model")["received"]["train_config"]]
    tuned = records.of("tune_model") or [records.one("tune_model")]  # none: fails naming why
    return [rec["received"][which]["train_config"] for rec in tuned]


def as_received(dry: dict[str, Any], receipt: dict[str, Any], where: str) -> None:
    """A dry record against what the team's function received in a real run (``acme.churn.train:receipt``):
    the mapping in ``ctx.settings`` the same JSON (values, types, key order at every level), and the typed
    config it was called with holding the same values (its free mapping ``tags`` in the same order too).

    A sampled trial's receipt carries what the study's sampler drew (``sampled``, from the study's storage):
    those values take their keys' places in the dry record, which could not know them; their types, places
    and every other key are still held to it."""
    dry = {k: receipt.get("sampled", {}).get(k, v) for k, v in dry.items()}
    real = receipt["train_config"]
    assert json.dumps(real) == json.dumps(dry), (
        f"{where}: the dry record is not what the function received in a real run:\n dry  {json.dumps(dry)}\n"
        f" real {json.dumps(real)}"
    )
    typed = receipt["typed"]
    assert typed["type"] == "ChurnConfig", f"{where}: the function was called with a {typed['type']}"
    for key, value in dry.items():  # a nested model dumps its fields in its class's order: compare values there
        assert json.dumps(typed["config"][key], sort_keys=True) == json.dumps(value, sort_keys=True), (
            f"{where}: config.{key} arrived as {typed['config'][key]!r}, recorded dry as {value!r}"
        )
    assert acme.same_order(typed["config"]["tags"], dry["tags"]), f"{where}: config.tags' keys moved in a real run"


def tune_searches_the_function(records: Any, scenario: Any, entry: str) -> None:
    tuned = records.of("tune_model")
    assert tuned, f"{entry}: no tune_model step ran"
    for rec in tuned:
        got = rec["received"]
        assert got["train_function"] == acme.FUNCTION, f"tune_model searches {got['train_function']}"
        assert acme.same_order(got["baseline"]["train_config"], scenario.train_config)
        assert set(got["trial"]["train_config"]) == set(scenario.train_config)
    train = records.one("train_model")
    assert train["settings"]["tuned"], "train_model does not take the study's best settings"


def trial_config(records: Any, scenario: Any, entry: str) -> None:
    """A trial trains the team's function on the train section with the sampled values in place: the keys in
    the order the team wrote them, nested ones too."""
    got = records.one("tune_model")["received"]
    for which in ("baseline", "trial"):
        config = got[which]["train_config"]
        assert list(config) == list(scenario.train_config), f"{which} trial's keys: {list(config)}"
        assert acme.same_order(config["tags"], scenario.train_config["tags"]), f"{which} trial's nested keys moved"
    assert got["train_function"] == acme.FUNCTION


#: The checks that read what the team's function receives, and the dry records they read (:func:`dry_configs`):
#: each is also compared with what the function received in a real run (:func:`as_received`): train_model's on
#: an engine with one, a study's trials in the one real study (its baseline is the train section as written, as
#: every entry's tune_model baseline is).
READ_RECEIVED: dict[Check, tuple[str, ...]] = {
    team_function: ("train_model",),
    key_order: ("train_model",),
    trial_config: ("baseline", "trial"),
    tune_searches_the_function: ("baseline",),
}
#: The dry records a real study's trials are held to, not the entry's own real run.
TRIALS = ("baseline", "trial")


def feature_set(records: Any, scenario: Any, entry: str) -> None:
    got = records.one("validate_data")["settings"]
    assert got["features"] == "churn_training"
    assert got["feature_repo"].endswith("feature_repo")
    assert got["entity_timestamp_column"] == "event_timestamp"


def priced_profile(records: Any, scenario: Any, entry: str) -> None:
    got = trained(records, scenario, entry)
    assert got["prices"] is not None, (
        f"train_model ran with hardware profile {records.one('train_model')['hardware_profile']!r}, unpriced"
    )
    assert got["prices"]["currency"] == "EUR"
    assert got["budget"], "max_cost did not reach train_model"
    for component in ("tune_model", "profile_training"):
        for rec in records.of(component):
            assert rec["received"]["prices"], f"{component} ran with hardware profile {rec['hardware_profile']!r}"


def alias(records: Any, scenario: Any, entry: str) -> None:
    assert records.one("evaluate_model")["settings"]["alias"] == "prod"
    assert records.one("register_model")["settings"]["alias"] == "prod"


#: The steps of each entry that rebuild the team's model (the others' have them all; register_model rebuilds none).
REBUILDERS = {
    "team-kfp": ("evaluate_model",),
    "team-dag": ("evaluate_model",),
    "tune-trial": ("tune_model",),
}


def trust(records: Any, scenario: Any, entry: str) -> None:
    steps = REBUILDERS.get(entry, ("evaluate_model", "detect_drift", "optimize_model", "tune_model"))
    for component in steps:
        rec = records.one(component)
        assert acme.PACKAGE in rec["trusted_code"], f"{component} does not trust {acme.PACKAGE}: {rec['trusted_code']}"


def drift(records: Any, scenario: Any, entry: str) -> None:
    got = records.one("detect_drift")["settings"]
    assert got["drift_share"] == 0.3
    assert got["alias"] == "prod"


def optimize(records: Any, scenario: Any, entry: str) -> None:
    got = records.one("optimize_model")["settings"]
    assert got["variants"] == ["onnx", "int8_dynamic"]
    assert got["max_metric_drop"] == 0.02
    assert records.one("register_model")["settings"]["optimized"], "register_model is not given the variant"


def approval(records: Any, scenario: Any, entry: str) -> None:
    assert records.one("register_model")["settings"]["move_alias"] is False


SCHEDULER = "tests/integration/test_airflow_scheduler.py"
SLURM = "tests/integration/test_slurm.py"
TUNE = "tests/integration/test_tune_model.py"
SLURM_CLI = f"{SLURM}::test_a_warned_job_checkpoints_requeues_and_ends_as_an_uninterrupted_run_registered_from_the_cli"

#: Declared once: every feature x every entry.
CELLS: dict[tuple[str, str], Check | NA | RunFor] = {
    # a team's function with a typed config
    ("team-function", "kfp-local"): team_function,
    ("team-function", "airflow-local"): team_function,
    ("team-function", "cli"): team_function,
    ("team-function", "module"): team_function,
    ("team-function", "team-kfp"): team_function,
    ("team-function", "team-dag"): team_function,
    ("team-function", "tune-trial"): RunFor(
        f"{TUNE}::test_a_team_function_is_tuned_on_the_metric_it_logs_against_its_baseline", "the trial trains it"
    ),
    ("team-function", "slurm"): RunFor(SLURM_CLI, "the job runs it"),
    # key order
    ("key-order", "kfp-local"): key_order,
    ("key-order", "airflow-local"): key_order,
    ("key-order", "cli"): key_order,
    ("key-order", "module"): key_order,
    ("key-order", "team-kfp"): key_order,
    ("key-order", "team-dag"): key_order,
    ("key-order", "tune-trial"): trial_config,
    ("key-order", "slurm"): RunFor(
        "tests/unit/test_config_roundtrip.py::test_train_config_arrives_as_written", "the sbatch script's settings"
    ),
    # tune
    ("tune", "kfp-local"): tune_searches_the_function,
    ("tune", "airflow-local"): tune_searches_the_function,
    ("tune", "cli"): tune_searches_the_function,
    ("tune", "module"): tune_searches_the_function,
    ("tune", "team-kfp"): NA("the README's team pipeline has no tune step; a team adding one uses the same face"),
    ("tune", "team-dag"): NA("the README's team DAG has no tune step; a team adding one uses the same operator"),
    ("tune", "tune-trial"): RunFor(
        f"{TUNE}::test_a_team_function_is_tuned_on_the_metric_it_logs_against_its_baseline",
        "trials train the team's function",
    ),
    ("tune", "slurm"): NA("a study's trials run where tune_model runs, not as Slurm jobs"),
    # a Feast training set
    ("feature-set", "kfp-local"): feature_set,
    ("feature-set", "airflow-local"): feature_set,
    ("feature-set", "cli"): feature_set,
    ("feature-set", "module"): feature_set,
    ("feature-set", "team-kfp"): feature_set,
    ("feature-set", "team-dag"): feature_set,
    ("feature-set", "tune-trial"): NA("a trial trains on the snapshot validate_data made; it joins nothing"),
    ("feature-set", "slurm"): NA("the training set is joined before training; a Slurm job trains on the snapshot"),
    # a priced profile and budgets
    ("priced-profile", "kfp-local"): priced_profile,
    ("priced-profile", "airflow-local"): priced_profile,
    ("priced-profile", "cli"): priced_profile,
    ("priced-profile", "module"): priced_profile,
    ("priced-profile", "team-kfp"): priced_profile,
    ("priced-profile", "team-dag"): priced_profile,
    ("priced-profile", "tune-trial"): RunFor(
        f"{TUNE}::test_cost_is_an_objective_and_a_study_budget_stops_it_until_a_larger_one_continues_it",
        "each trial's cost at the prices",
    ),
    ("priced-profile", "slurm"): RunFor(SLURM_CLI, "the job's cost"),
    # the alias
    ("alias", "kfp-local"): alias,
    ("alias", "airflow-local"): alias,
    ("alias", "cli"): alias,
    ("alias", "module"): alias,
    ("alias", "team-kfp"): alias,
    ("alias", "team-dag"): alias,
    ("alias", "tune-trial"): NA("a trial registers nothing"),
    ("alias", "slurm"): NA("a Slurm job trains; the alias is register_model's"),
    # trust
    ("trust", "kfp-local"): trust,
    ("trust", "airflow-local"): trust,
    ("trust", "cli"): trust,
    ("trust", "module"): trust,
    ("trust", "team-kfp"): trust,
    ("trust", "team-dag"): trust,
    ("trust", "tune-trial"): trust,
    ("trust", "slurm"): NA("a training imports its own function; trust is for the steps that rebuild its model"),
    # drift
    ("drift", "kfp-local"): drift,
    ("drift", "airflow-local"): drift,
    ("drift", "cli"): drift,
    ("drift", "module"): drift,
    ("drift", "team-kfp"): NA("the README's team pipeline has no drift step"),
    ("drift", "team-dag"): NA("the README's team DAG has no drift step"),
    ("drift", "tune-trial"): NA("a trial does not decide whether to retrain"),
    ("drift", "slurm"): NA("a Slurm job trains; the drift decision is before it"),
    # optimize
    ("optimize", "kfp-local"): optimize,
    ("optimize", "airflow-local"): optimize,
    ("optimize", "cli"): optimize,
    ("optimize", "module"): optimize,
    ("optimize", "team-kfp"): NA("the README's team pipeline has no optimize step"),
    ("optimize", "team-dag"): NA("the README's team DAG has no optimize step"),
    ("optimize", "tune-trial"): NA("a trial's model is not served"),
    ("optimize", "slurm"): NA("optimize_model runs after the gate, not in the training job"),
    # approval
    ("approval", "kfp-local"): approval,
    ("approval", "airflow-local"): RunFor(
        "tests/integration/test_airflow_celery.py::test_celery_workers_by_queue_approval_rejection_timeout_and_a_killed_worker",
        "dag.test() cannot answer a person: approved on a deployment",
    ),
    ("approval", "cli"): approval,
    ("approval", "module"): approval,
    ("approval", "team-kfp"): NA("the README's team pipeline moves the alias itself"),
    ("approval", "team-dag"): NA("the README's team DAG moves the alias itself"),
    ("approval", "tune-trial"): NA("a trial registers nothing"),
    ("approval", "slurm"): NA("a Slurm job trains; the approval is after the gate"),
    # Slurm
    ("slurm", "kfp-local"): NA("kfp.local runs steps as local processes; a Slurm job is train_model's own setting"),
    ("slurm", "airflow-local"): RunFor(
        f"{SLURM}::test_the_training_dag_runs_train_model_on_slurm_and_registers", "the DAG's job"
    ),
    ("slurm", "cli"): RunFor(SLURM_CLI, "sbatch from the command"),
    ("slurm", "module"): RunFor(SLURM_CLI, "the same entrypoint"),
    ("slurm", "team-kfp"): NA("KFP runs training in its own pods; Slurm is for clusters without Kubernetes"),
    ("slurm", "team-dag"): RunFor(
        f"{SLURM}::test_on_kill_cancels_the_job_whether_deferred_or_waiting_in_the_task", "an operator's job"
    ),
    ("slurm", "tune-trial"): NA("trials run where tune_model runs"),
    ("slurm", "slurm"): RunFor(SLURM_CLI, "preemption and requeue"),
}
