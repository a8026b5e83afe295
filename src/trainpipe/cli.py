"""The ``trainpipe`` command.

``trainpipe run``, ``compile``, ``demo``, and one subcommand per component that
forwards its flags to the component's entrypoint (``trainpipe validate_data --help``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import typing
from pathlib import Path

import typer

from trainpipe import COMPONENTS
from trainpipe.contract.errors import TrainpipeError

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Reusable ML pipeline components for Kubeflow Pipelines and Airflow.")


def _fail(exc: TrainpipeError) -> None:
    typer.echo(f"trainpipe: error: {exc}", err=True)
    raise typer.Exit(exc.exit_code)


def _make_component_command(name: str) -> None:
    @app.command(
        name=name,
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []},
        help=f"Run the {name} component (same as python -m trainpipe.components.{name}; --help lists its flags).",
        add_help_option=False,
    )
    def _command(ctx: typer.Context) -> None:
        proc = subprocess.run([sys.executable, "-m", f"trainpipe.components.{name}", *ctx.args], check=False)
        raise typer.Exit(proc.returncode)


for _name in COMPONENTS:
    _make_component_command(_name)


def _repo_dags_folder() -> Path:
    return Path(__file__).resolve().parents[2] / "dags"


def run_airflow_local(config_path: Path, workspace: Path) -> str:
    """Run the training DAG once under ``dag.test()`` with a SQLite metadata DB in the workspace."""
    dags = _repo_dags_folder()
    if not (dags / "training_dag.py").is_file():
        raise TrainpipeError("engine airflow-local needs the dags/ folder of a trainpipe checkout")
    home = workspace / "airflow"
    home.mkdir(parents=True, exist_ok=True)
    env = dict(
        os.environ,
        AIRFLOW_HOME=str(home),
        AIRFLOW__CORE__DAGS_FOLDER=str(dags),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        TRAINPIPE_CONFIG=str(config_path),
    )
    # one process: migrating the metadata DB here (what `airflow db migrate` does: create it on the
    # first run, upgrade it after an Airflow upgrade) spares a second Airflow start-up, about 3 s a run
    code = (
        "import sys\nfrom airflow.utils import db\ndb.upgradedb()\n"
        "from airflow.dag_processing.dagbag import DagBag\n"
        f"bag = DagBag({str(dags)!r})\n"
        "dr = bag.dags['trainpipe_training'].test()\n"
        "sys.exit(0 if str(dr.state) in ('success', 'DagRunState.SUCCESS') else 1)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], env=env, check=False)
    if proc.returncode != 0:
        raise TrainpipeError("the Airflow run did not succeed (task logs above)")
    return str(home)


def _apply_policy(cfg: "typing.Any") -> None:
    """Check the config against its policy before anything runs, and hand the policy, the
    workspace and the audit log to every step (they check again at run time)."""
    from trainpipe.contract import audit, policy as policy_mod

    policy = cfg.check_policy()
    os.environ[policy_mod.ENV] = policy_mod.to_env(policy)
    os.environ.setdefault("TRAINPIPE_WORKSPACE", cfg.workspace)
    if not os.environ.get(audit.ENV):
        os.environ[audit.ENV] = policy.audit_log or str(Path(cfg.workspace) / "audit" / "audit.jsonl")


@app.command()
def run(
    config: Path = typer.Option(..., "--config", "-c", help="pipeline config YAML"),
    engine: str = typer.Option("kfp-local", help="kfp-local or airflow-local"),
) -> None:
    """Run the reference training pipeline end to end on this machine."""
    from trainpipe.pipelines.config import load_pipeline_config
    from trainpipe.runs import collect_results, describe

    try:
        cfg = load_pipeline_config(config)
        if engine not in ("kfp-local", "airflow-local"):
            raise TrainpipeError(f"engine: {engine!r} is not kfp-local or airflow-local")
        _apply_policy(cfg)
        started = time.time()
        typer.echo(f"trainpipe: running the reference pipeline with engine {engine}", err=True)
        if engine == "kfp-local":
            from trainpipe.pipelines.compile import run_local

            root = run_local(cfg)["pipeline_root"]
        else:
            run_airflow_local(config.resolve(), Path(cfg.workspace))
            root = str(Path(cfg.workspace) / "airflow-runs")
        from trainpipe.pipelines.compile import compile_pipeline

        yaml_path = compile_pipeline(Path(cfg.workspace) / "pipeline.kfp.yaml", cfg.profile, policy=cfg.effective_policy())
        results = collect_results(root, since=started)
    except TrainpipeError as exc:
        _fail(exc)
    typer.echo(f"\ntrainpipe: pipeline finished (engine {engine})")
    typer.echo(describe(results, cfg.tracking_uri or "", str(yaml_path)))


@app.command(name="compile")
def compile_cmd(
    output: Path = typer.Option(Path("pipeline.yaml"), "--output", "-o", help="where to write the IR YAML"),
    profile: str = typer.Option("cpu", help="hardware profile: cpu, gpu, or a YAML file"),
    policy: Path = typer.Option(None, help="policy YAML put on every task (default: TRAINPIPE_POLICY)"),
    pipeline_root: str = typer.Option(None, help="where KFP keeps the run's artifacts, checked against the policy"),
) -> None:
    """Compile the reference pipeline to KFP IR YAML."""
    from trainpipe.contract.policy import load_policy
    from trainpipe.pipelines.compile import compile_pipeline

    try:
        path = compile_pipeline(output, profile, policy=load_policy(str(policy)) if policy else None, pipeline_root=pipeline_root)
    except TrainpipeError as exc:
        _fail(exc)
    typer.echo(str(path))


def _print_kfp_result(call: "typing.Callable[[], dict]") -> None:
    """Run a kfp.Client call with kfp's own prints sent to stderr; stdout carries the JSON result only."""
    import contextlib
    import json

    try:
        with contextlib.redirect_stdout(sys.stderr):
            result = call()
    except TrainpipeError as exc:
        _fail(exc)
    typer.echo(json.dumps(result, sort_keys=True))


@app.command()
def upload(
    host: str = typer.Option(..., help="the KFP API, e.g. https://kubeflow.example.com/pipeline"),
    package: Path = typer.Option(Path("pipeline.yaml"), help="the compiled pipeline (trainpipe compile -o ...)"),
    pipeline_name: str = typer.Option("trainpipe-training", help="a new pipeline, or a new version of this one"),
    version: str = typer.Option(None, help="version name (default: trainpipe version and git commit)"),
    namespace: str = typer.Option(None, help="Kubeflow profile namespace (multi-user)"),
    description: str = typer.Option("", help="version description"),
) -> None:
    """Upload the compiled pipeline as a new pipeline or a new version (token: KFP_EXISTING_TOKEN or kfp's in-cluster credentials)."""

    from trainpipe.pipelines.publish import upload as do_upload

    _print_kfp_result(lambda: do_upload(package, host, pipeline_name, version, namespace, description))


@app.command()
def schedule(
    host: str = typer.Option(..., help="the KFP API"),
    cron: str = typer.Option(..., help="cron expression; 5 fields get seconds 0 prepended (KFP takes 6)"),
    pipeline_name: str = typer.Option("trainpipe-training"),
    version_id: str = typer.Option(None, help="default: the newest version"),
    experiment: str = typer.Option("trainpipe"),
    job_name: str = typer.Option("trainpipe-training-schedule"),
    config: Path = typer.Option(None, help="pipeline config (YAML) whose values become the run's parameters"),
    namespace: str = typer.Option(None),
    caching: bool = typer.Option(True, help="--no-caching runs every task afresh (with --package)"),
    package: Path = typer.Option(None, help="submit this compiled pipeline with the schedule instead of an uploaded version"),
    service_account: str = typer.Option(None, help="Kubernetes service account of the runs' pods (default: the config's hardware profile's)"),
) -> None:
    """Create a recurring run of the uploaded pipeline."""

    from trainpipe.pipelines.config import load_pipeline_config
    from trainpipe.pipelines.publish import schedule as do_schedule

    def call() -> dict:
        from trainpipe.profiles import get_profile

        cfg = load_pipeline_config(config) if config else None
        if cfg:
            cfg.check_policy()
        params = cfg.pipeline_arguments() if cfg else {}
        account = service_account or (get_profile(cfg.profile).service_account if cfg else None)
        return do_schedule(host, pipeline_name, cron, experiment, job_name, params, version_id, namespace, caching, package,
                           service_account=account)

    _print_kfp_result(call)


@app.command()
def scaffold(
    name: str = typer.Argument(..., help="the new component's name (a lowercase Python identifier)"),
    components_dir: Path = typer.Option(Path("components"), help="where component folders live"),
    tests_dir: Path = typer.Option(Path("tests/unit"), help="where its test goes"),
) -> None:
    """Write a new component on the trainpipe contract (every role) and a passing test."""
    from trainpipe.scaffold import scaffold as do_scaffold

    try:
        paths = do_scaffold(name, components_dir, tests_dir)
    except TrainpipeError as exc:
        _fail(exc)
    for path in paths:
        typer.echo(str(path))
    typer.echo(f"next: add \"trainpipe.components.{name}\" to [tool.setuptools] packages in pyproject.toml, then make test", err=True)


components_app = typer.Typer(no_args_is_help=True, help="Reusable component specs.")
app.add_typer(components_app, name="components")


@components_app.command("export")
def components_export(
    directory: Path = typer.Argument(..., help="where to write <name>.yaml for each component"),
) -> None:
    """Write each component's compiled KFP spec, loadable with kfp.components.load_component_from_file."""
    from trainpipe.pipelines.compile import export_components

    for path in export_components(directory):
        typer.echo(str(path))


@app.command()
def lineage(
    model_uri: str = typer.Argument(..., help="models:/<name>@<alias> or models:/<name>/<version>"),
    tracking_uri: str = typer.Option(None, help="MLflow tracking URI (default: MLFLOW_TRACKING_URI)"),
    as_json: bool = typer.Option(False, "--json", help="print the lineage and the verification as JSON"),
    verify: bool = typer.Option(True, help="fetch the snapshot from its DVC remote and check its hash"),
) -> None:
    """Print the chain from a registered model version back to the raw data, and verify the snapshot.

    Exit codes: 0 verified, 2 bad URI or unknown model, 3 verification failed, 75 MLflow unreachable.
    """
    from trainpipe.lineage_report import lineage_command

    try:
        text, ok = lineage_command(model_uri, tracking_uri, as_json, verify)
    except TrainpipeError as exc:
        _fail(exc)
    typer.echo(text)
    if not ok:
        typer.echo("trainpipe: error: lineage verification failed (see the verify line)", err=True)
        raise typer.Exit(3)


audit_app = typer.Typer(no_args_is_help=True, help="The audit trail: an append-only, hash-chained log of every execution, gate decision and alias change.")
app.add_typer(audit_app, name="audit")


@audit_app.command("verify")
def audit_verify(
    log: Path = typer.Argument(None, help="the audit log (default: TRAINPIPE_AUDIT_LOG, or the policy's audit_log)"),
) -> None:
    """Recompute the hash chain: exit 0 when intact, 6 naming the first edited, removed or reordered record."""
    from trainpipe.contract import audit
    from trainpipe.contract.policy import load_policy

    try:
        path = log or audit.log_path(load_policy().audit_log)
        if path is None:
            from trainpipe.contract.errors import InputError

            raise InputError("audit_log: no log given, and neither TRAINPIPE_AUDIT_LOG nor the policy's audit_log is set")
        summary = audit.verify(Path(path))
    except TrainpipeError as exc:
        _fail(exc)
    typer.echo(f"trainpipe: audit log {path}: intact, {summary['records']} records, head {summary['head']}")


@app.command()
def demo(
    workspace: Path = typer.Option(Path(".trainpipe/demo"), help="where the demo keeps its data and state"),
    engine: str = typer.Option("kfp-local", help="kfp-local or airflow-local"),
) -> None:
    """Write scikit-learn's digits as raw CSV and run the reference pipeline on it."""
    from trainpipe.demo import write_demo_config

    config = write_demo_config(workspace)
    typer.echo(f"trainpipe: demo config {config}", err=True)
    run(config=config, engine=engine)


if __name__ == "__main__":  # pragma: no cover
    app()
