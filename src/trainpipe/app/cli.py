"""The ``trainpipe`` command.

``trainpipe run``, ``compile``, ``demo``, and one subcommand per component that
forwards its flags to the component's entrypoint (``trainpipe validate_data --help``).
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import threading
import time
import typing
from pathlib import Path

import typer

from trainpipe import COMPONENTS
from trainpipe.app.component import run_component
from trainpipe.app.runner import LOAD
from trainpipe.contract.errors import InputError, TrainpipeError
from trainpipe.services.registry import DEFAULT_ALIAS

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Reusable ML pipeline components for Kubeflow Pipelines and Airflow.",
)


def _fail(exc: TrainpipeError, error_record: Path | None = None, command: str = "trainpipe") -> None:
    typer.echo(f"trainpipe: error: {exc}", err=True)
    if error_record is not None:  # what a runner reads instead of this line (an Airflow task's promote)
        from trainpipe.contract.result import ErrorRecord

        ErrorRecord(component=command, exit_code=exc.exit_code, message=str(exc)).write(error_record)
    raise typer.Exit(exc.exit_code)


def _make_component_command(name: str) -> None:
    @app.command(
        name=name,
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []},
        help=f"Run the {name} component (same as python -m trainpipe.components.{name}; --help lists its flags).",
        add_help_option=False,
    )
    def _command(ctx: typer.Context) -> None:
        run_component(name, ctx.args)  # the entrypoint itself, in this process (`trainpipe` goes there first)


for _name in COMPONENTS:
    _make_component_command(_name)


CONFIG_ENV = "TRAINPIPE_CONFIG"
#: Where a config is looked for when none is named: the current folder, then the demo's.
CONFIG_PLACES = (Path("pipeline.yaml"), Path(".trainpipe/demo/pipeline.yaml"))
STEP_LINE = re.compile(r"trainpipe ((?:" + "|".join(COMPONENTS) + r")(?::| \S+:).*)")
#: A step's failure as the engine log repeats it: the step's own line (a preemption's too), a retried attempt's refusal.
FAILURE_LINE = re.compile(
    r"^(?:trainpipe )?\S+: (error: |preempted|internal error|an earlier attempt of this task failed for good)"
)


def default_config(config: Path | None, required: bool = True, demo: bool = True) -> Path | None:
    """The pipeline config every command uses: ``--config``, else ``TRAINPIPE_CONFIG``, else
    ``./pipeline.yaml``, else the demo's (``.trainpipe/demo/pipeline.yaml``). ``demo=False`` (what a cluster
    gets: ``compile``, ``schedule``) never falls back to the demo's, a config of this machine's demo: after
    ``make demo``, a bare ``trainpipe compile`` compiled the demo's data and names into the pipeline.

    Raises:
        InputError: none is found and one is required.
    """
    from trainpipe.contract.errors import InputError

    if config is not None:
        return config
    if os.environ.get(CONFIG_ENV):
        return Path(os.environ[CONFIG_ENV])
    for place in CONFIG_PLACES if demo else CONFIG_PLACES[:1]:
        if place.is_file():
            return place
    if required:
        raise InputError(f"config: none given; pass --config, set {CONFIG_ENV}, or run where pipeline.yaml is")
    return None


def _tail(path: Path, stop: threading.Event, show: typing.Callable[[str], None]) -> None:
    """Show the engine log's step lines as they are written, until ``stop``."""
    seen: set[str] = set()
    with open(path, encoding="utf-8", errors="replace") as fh:
        while True:
            line = fh.readline()
            if line:
                m = STEP_LINE.search(line)
                text = (
                    re.sub(r"\s+\[airflow\.task\.operators\..*$", "", m.group(0)) if m else ""
                )  # Airflow's logger suffix
                # a failure is shown once, by the run's summary (the step's line, a retry's "failed for good")
                if text and text not in seen and not FAILURE_LINE.search(text):
                    seen.add(text)
                    show("  " + text[:400])
                continue
            if stop.is_set():
                return
            time.sleep(0.2)


def run_engine(engine: str, config_path: Path, workspace: Path) -> tuple[int, Path, dict | None, int | None]:
    """Run an engine in a child process, its whole output in a log file under the workspace; the
    terminal shows each step's result line. Returns ``(exit code, log, the failed step's report, the
    signal that stopped the run or None)``.

    The engine runs under a lifeline (:func:`~trainpipe.contract.lifeline.supervise`): this process
    killed (SIGKILL: a CI job cancelled, a wrapper's timeout), every process of the run stops; a SIGTERM,
    a Ctrl-C or a closed terminal is passed on, each training checkpoints at its step's end, and this
    returns once every process of the run has exited."""
    import json
    import signal

    from trainpipe.contract.lifeline import PARENT_ENV, STOP_SIGNALS, supervised

    logs = Path(workspace) / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    log = logs / f"run-{stamp}-{engine}.log"
    failure = logs / f".failure-{stamp}-{os.getpid()}.json"
    env = dict(os.environ, TRAINPIPE_FAILURE_FILE=str(failure), **{PARENT_ENV: str(os.getpid())})
    stop = threading.Event()
    stopped: list[int] = []
    with open(log, "w", encoding="utf-8") as out:
        tail = threading.Thread(target=_tail, args=(log, stop, lambda t: typer.echo(t, err=True)), daemon=True)
        tail.start()
        proc = subprocess.Popen(
            supervised([sys.executable, "-m", "trainpipe.app.runner", engine, str(config_path)]),
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )

        def pass_on(signum: int, _frame: typing.Any) -> None:
            stopped.append(signum)
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)

        previous = {signum: signal.signal(signum, pass_on) for signum in STOP_SIGNALS}
        try:
            code = proc.wait()
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
    stop.set()
    tail.join(timeout=5)
    report = json.loads(failure.read_text(encoding="utf-8")) if failure.exists() else None
    failure.unlink(missing_ok=True)
    return code, log, report, (stopped[0] if stopped else None)


def _apply_policy(cfg: typing.Any) -> None:
    """Check the config against its policy before anything runs, and hand the policy, the
    workspace and the audit log to every step (they check again at run time)."""
    from trainpipe.contract import audit
    from trainpipe.contract import policy as policy_mod

    policy = cfg.check_policy()
    os.environ[policy_mod.ENV] = policy_mod.to_env(policy)
    os.environ.setdefault("TRAINPIPE_WORKSPACE", cfg.workspace)
    if not os.environ.get(audit.ENV):
        os.environ[audit.ENV] = policy.audit_log or str(Path(cfg.workspace) / "audit" / "audit.jsonl")


@app.command()
def run(
    config: Path = typer.Option(
        None, "--config", "-c", help="pipeline config YAML (default: TRAINPIPE_CONFIG, ./pipeline.yaml)"
    ),
    engine: str = typer.Option("kfp-local", help="kfp-local or airflow-local"),
    dry_run: bool = typer.Option(
        False,
        "--dry-run",
        help="every step checks its settings, writes what it received under <workspace>/dry-run/ and does nothing "
        "else: no data read, nothing trained or registered",
    ),
) -> None:
    """Run the reference training pipeline end to end on this machine.

    The terminal shows each step's result line and a summary; the engine's whole log goes to a
    file under the workspace, which the summary names. A step that fails ends the run with that
    step's name, its one line and its own exit code (2 bad input, 3 data failed its suite, 75
    a service unavailable, 77 not permitted). With --dry-run, the summary lists what each step received.
    """
    run_pipeline(config, engine, dry_run)


class _Compiling:
    """The run's KFP YAML (``pipeline.kfp.yaml``, which the summary names) compiled on a thread while the engine
    runs, not after it: importing kfp and building the pipeline is about one ``import torch`` that the run's wall
    no longer waits for, as the main thread only waits on the engine's process. Kept in memory (its file is read
    back and removed at once, so a killed command leaves none) and written when the run succeeded; a run that
    failed or stopped leaves none, as when it was compiled after."""

    def __init__(self, target: Path, cfg: typing.Any) -> None:
        self.target = target
        self.text: bytes | None = None
        self.error: BaseException | None = None
        settings = {
            "policy": cfg.effective_policy(),
            "trusted_code": cfg.trusted_code(),
            "optimize": cfg.optimize,
            "require_approval": cfg.require_approval,
            "tune": cfg.tune_settings(),
        }
        # a daemon: a failed run's exit never waits for a YAML nobody will read
        self.thread = threading.Thread(target=self._run, args=(cfg.profile, settings), daemon=True)
        self.thread.start()

    def _run(self, profile: str, settings: dict[str, typing.Any]) -> None:
        # kfp writes the file last, by its suffix: it lives the milliseconds between that write and its removal
        tmp = self.target.with_name(f".{self.target.stem}.{os.getpid()}{self.target.suffix}")
        # the YAML is read once the run has ended: it takes a core when the run leaves one idle, not while the
        # engine and the steps' warm host start (Linux's nice is a thread's own; elsewhere the thread keeps its own)
        with contextlib.suppress(OSError, AttributeError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        try:
            from trainpipe.pipelines.compile import compile_pipeline

            self.text = compile_pipeline(tmp, profile, **settings).read_bytes()
        except BaseException as exc:  # noqa: BLE001 (raised where the run's result is read, in the main thread)
            self.error = exc
        finally:
            tmp.unlink(missing_ok=True)

    def result(self) -> Path:
        """The YAML in place, once compiled; raises what compiling raised."""
        from trainpipe.contract.io import atomic_write_bytes

        self.thread.join()
        if self.error is not None:
            raise self.error
        atomic_write_bytes(self.target, typing.cast(bytes, self.text))
        return self.target


def run_pipeline(config: Path | None, engine: str, dry_run: bool) -> None:
    """What ``trainpipe run`` does, as a plain function: ``demo`` calls this, never the typer command, whose
    parameters' defaults are typer's ``Option`` objects (a truthy ``dry_run`` there made the demo a dry run)."""
    from trainpipe.pipelines.config import load_pipeline_config
    from trainpipe.services.runs import collect_results, describe

    try:
        path = default_config(config)
        cfg = load_pipeline_config(path)
        if engine not in ("kfp-local", "airflow-local"):
            raise InputError(f"engine: {engine!r} is not kfp-local or airflow-local")
        cfg.check_engine(engine)
        _apply_policy(cfg)
        started = time.time()
        dry_folder = None
        if dry_run:
            from trainpipe.contract import dry

            dry_folder = Path(cfg.workspace) / "dry-run" / time.strftime("%Y%m%d-%H%M%S")
            os.environ[dry.ENV] = str(dry_folder)  # the engine and every step it starts inherit it
        typer.echo(f"trainpipe: running the reference pipeline with engine {engine} ({path})", err=True)
        compiling = None if dry_run else _Compiling(Path(cfg.workspace) / "pipeline.kfp.yaml", cfg)
        code, log, failed, signum = run_engine(engine, typing.cast(Path, path).resolve(), Path(cfg.workspace))
        if signum is not None:
            import signal

            from trainpipe.contract.errors import EXIT_TRANSIENT

            with contextlib.suppress(OSError):  # a closed terminal (SIGHUP) cannot show it
                typer.echo(
                    f"trainpipe run: stopped by {signal.Signals(signum).name}: every step of the run has exited, "
                    f"each training after a checkpoint at its step's end; full log: {log}",
                    err=True,
                )
            raise typer.Exit(EXIT_TRANSIENT)
        if code != 0:
            if failed and failed["component"] == LOAD:  # refused before any step: the same line as a refusal here
                refusal = TrainpipeError(failed["message"])
                refusal.exit_code = int(failed["exit_code"])
                typer.echo(f"trainpipe run: full log: {log}", err=True)
                _fail(refusal)
            if failed:
                typer.echo(
                    f"trainpipe run: step {failed['component']} failed (exit {failed['exit_code']}): "
                    f"{failed['message']}",
                    err=True,
                )
                typer.echo(f"trainpipe run: full log: {log}", err=True)
                raise typer.Exit(int(failed["exit_code"]) or 1)
            typer.echo(
                f"trainpipe run: the {engine} engine failed before any step reported (exit {code}); full log: {log}",
                err=True,
            )
            raise typer.Exit(1)
        if dry_folder is not None:
            from trainpipe.contract.dry import summarize

            typer.echo(f"\ntrainpipe: dry run finished (engine {engine}): nothing was read, trained or registered")
            typer.echo(summarize(dry_folder))
            typer.echo(f"full log         : {log}")
            return
        root = Path(cfg.workspace) / ("kfp-local" if engine == "kfp-local" else "airflow-runs")
        yaml_path = typing.cast(_Compiling, compiling).result()
        results = collect_results(root, since=started)
    except TrainpipeError as exc:
        _fail(exc)
    typer.echo(f"\ntrainpipe: pipeline finished (engine {engine})")
    typer.echo(describe(results, cfg.tracking_uri or "", str(yaml_path)))
    typer.echo(f"full log         : {log}")


@app.command(name="compile")
def compile_cmd(
    output: Path = typer.Option(Path("pipeline.yaml"), "--output", "-o", help="where to write the IR YAML"),
    profile: str = typer.Option(
        None, help="hardware profile: cpu, cpu-smb, gpu, or a YAML file (default: the config's, else cpu)"
    ),
    policy: Path = typer.Option(
        None, help="policy YAML put on every task (default: the config's, else TRAINPIPE_POLICY)"
    ),
    pipeline_root: str = typer.Option(None, help="where KFP keeps the run's artifacts, checked against the policy"),
    config: Path = typer.Option(
        None, "--config", "-c", help="pipeline config (default: TRAINPIPE_CONFIG, ./pipeline.yaml, if any)"
    ),
) -> None:
    """Compile the reference pipeline to KFP IR YAML.

    With a config, its values are the pipeline's parameter defaults; a place on this machine or a URI holding a
    password is left for the run to pass (said on stderr), a local tune storage as the run parameter tune_storage.
    """
    from trainpipe.contract.policy import load_policy
    from trainpipe.pipelines.compile import compile_config, compile_pipeline
    from trainpipe.pipelines.config import load_pipeline_config

    try:
        path = default_config(config, required=False, demo=False)
        cfg = load_pipeline_config(path) if path else None
        rules = load_policy(str(policy)) if policy else None
        if cfg is None:
            out = compile_pipeline(output, profile or "cpu", policy=rules, pipeline_root=pipeline_root)
        else:
            out, notes = compile_config(cfg, output, profile=profile, policy=rules, pipeline_root=pipeline_root)
            for line in notes:
                typer.echo(f"trainpipe compile: {line}", err=True)
    except TrainpipeError as exc:
        _fail(exc)
    typer.echo(str(out))


def _print_kfp_result(call: typing.Callable[[], dict]) -> None:
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
def tune(
    config: Path = typer.Option(..., "--config", "-c", help="tune_model's settings (YAML or JSON: space, train, ...)"),
    emit: str = typer.Option(..., help="what to write: optimizationjob (a Kubeflow Trainer OptimizationJob)"),
    output: Path = typer.Option(Path("optimizationjob.yaml"), "--output", "-o", help="where the manifest goes"),
    data: str = typer.Option(..., help="the dataset every trial's pod reads (a path on its volume, or a URI)"),
    output_root: str = typer.Option("/mnt/trainpipe/trials", help="where each trial writes its model"),
    namespace: str = typer.Option("kubeflow", help="the job's namespace"),
    workers: int = typer.Option(1, min=1, help="trials at once"),
    image: str = typer.Option(
        None, help="the trainpipe image (default: the CPU image, or the GPU one for --profile gpu)"
    ),
    profile: str = typer.Option("cpu", help="hardware profile of each trial's node: cpu, gpu, or a YAML file"),
) -> None:
    """Write the search of a tune_model config as a Kubeflow Trainer OptimizationJob (nothing is submitted)."""
    import yaml

    from trainpipe.components.tune_model.optimizationjob import manifest
    from trainpipe.components.tune_model.spec import TuneModelParams
    from trainpipe.contract.config import build, load_file
    from trainpipe.contract.io import atomic_write_text
    from trainpipe.services.images import image_for
    from trainpipe.services.profiles import get_profile

    if emit != "optimizationjob":
        _fail(InputError(f"--emit: {emit!r} is not optimizationjob (run `trainpipe tune_model` to tune here)"))
    try:
        params = build(TuneModelParams, load_file(config), where="tune config")
        hw = get_profile(profile)
        doc = manifest(
            params,
            name=params.study_name or "trainpipe-tune",
            namespace=namespace,
            image=image or image_for("train_model", accelerated=hw.train.accelerated),
            data=data,
            output_root=output_root,
            workers=workers,
            resources=hw.train.as_k8s(),
        )
        atomic_write_text(output, yaml.safe_dump(doc, sort_keys=False))
    except TrainpipeError as exc:
        _fail(exc)
    typer.echo(
        f"wrote {output}: OptimizationJob {doc['metadata']['name']} ({params.n_trials} trials, {workers} at once)"
    )


@app.command()
def upload(
    host: str = typer.Option(..., help="the KFP API, e.g. https://kubeflow.example.com/pipeline"),
    package: Path = typer.Option(Path("pipeline.yaml"), help="the compiled pipeline (trainpipe compile -o ...)"),
    pipeline_name: str = typer.Option("trainpipe-training", help="a new pipeline, or a new version of this one"),
    version: str = typer.Option(None, help="version name (default: trainpipe version and git commit)"),
    namespace: str = typer.Option(None, help="Kubeflow profile namespace (multi-user)"),
    description: str = typer.Option("", help="version description"),
) -> None:
    """Upload the compiled pipeline as a new pipeline or a new version (token: KFP_EXISTING_TOKEN or kfp's
    in-cluster credentials)."""

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
    config: Path = typer.Option(
        None,
        "--config",
        "-c",
        help="pipeline config whose values become the run's parameters (default: TRAINPIPE_CONFIG, ./pipeline.yaml)",
    ),
    namespace: str = typer.Option(None),
    caching: bool = typer.Option(True, help="--no-caching runs every task afresh (with --package)"),
    package: Path = typer.Option(
        None, help="submit this compiled pipeline with the schedule instead of an uploaded version"
    ),
    service_account: str = typer.Option(
        None, help="Kubernetes service account of the runs' pods (default: the config's hardware profile's)"
    ),
) -> None:
    """Create a recurring run of the uploaded pipeline."""

    from trainpipe.pipelines.config import load_pipeline_config
    from trainpipe.pipelines.publish import schedule as do_schedule

    def call() -> dict:
        from trainpipe.services.profiles import get_profile

        path = default_config(config, required=False, demo=False)
        cfg = load_pipeline_config(path) if path else None
        if cfg:
            cfg.check_policy()
        params = cfg.pipeline_arguments() if cfg else {}
        account = service_account or (get_profile(cfg.profile).service_account if cfg else None)
        return do_schedule(
            host,
            pipeline_name,
            cron,
            experiment,
            job_name,
            params,
            version_id,
            namespace,
            caching,
            package,
            service_account=account,
        )

    _print_kfp_result(call)


@app.command()
def scaffold(
    name: str = typer.Argument(..., help="the new component's name (a lowercase Python identifier)"),
    components_dir: Path = typer.Option(Path("components"), help="where component folders live"),
    tests_dir: Path | None = typer.Option(None, help="where its test goes (default: the component folder's tests/)"),
) -> None:
    """Write a new component on the trainpipe contract (every role) and a passing test."""
    from trainpipe.app.scaffold import scaffold as do_scaffold

    _wrote(
        lambda: do_scaffold(name, components_dir, tests_dir),
        "next: make docs (the lists that name every component, its README's settings table) and make golden (its "
        f"component.yaml); make component NAME={name} does both. Then change its core and make test",
    )


@app.command(name="scaffold-training")
def scaffold_training(
    name: str = typer.Argument(..., help="the new package's name (a lowercase Python identifier)"),
    directory: Path = typer.Option(
        Path("."), help="where the package goes (put this folder on PYTHONPATH, or install the package)"
    ),
    tests_dir: Path = typer.Option(Path("tests/integration"), help="where its test goes"),
) -> None:
    """Write a team package with a training function on trainpipe's context (``train_function:
    NAME.train:train``) and its test."""
    from trainpipe.app.scaffold import scaffold_training as do_scaffold

    _wrote(
        lambda: do_scaffold(name, directory, tests_dir),
        f"next: run it with --train-function {name}.train:train (its folder on PYTHONPATH), then change the loop",
    )


def _wrote(write: typing.Callable[[], list[Path]], next_step: str) -> None:
    """Run a scaffold: the paths it wrote on stdout, the next step on stderr (a refusal: one line)."""
    try:
        paths = write()
    except TrainpipeError as exc:
        _fail(exc)
    for path in paths:
        typer.echo(str(path))
    typer.echo(next_step, err=True)


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


def default_tracking_uri(tracking_uri: str | None, config: Path | None) -> str | None:
    """``--tracking-uri``, else ``MLFLOW_TRACKING_URI``, else the config's (its workspace's store by default)."""
    if tracking_uri or os.environ.get("MLFLOW_TRACKING_URI"):
        return tracking_uri
    path = default_config(config, required=False)
    if path is None:
        return None
    from trainpipe.pipelines.config import load_pipeline_config

    return load_pipeline_config(path).tracking_uri


@app.command()
def lineage(
    model_uri: str = typer.Argument(..., help="models:/<name>@<alias> or models:/<name>/<version>"),
    tracking_uri: str = typer.Option(
        None, help="MLflow tracking URI (default: MLFLOW_TRACKING_URI, else the config's)"
    ),
    config: Path = typer.Option(
        None, "--config", "-c", help="pipeline config (default: TRAINPIPE_CONFIG, ./pipeline.yaml, the demo's)"
    ),
    as_json: bool = typer.Option(False, "--json", help="print the lineage and the verification as JSON"),
    verify: bool = typer.Option(True, help="fetch the snapshot from its DVC remote and check its hash"),
) -> None:
    """Print the chain from a registered model version back to the raw data, and verify the snapshot.

    Exit codes: 0 verified, 2 bad URI or unknown model, 3 verification failed, 7 the model fails its signature,
    75 MLflow unreachable.
    """
    from trainpipe.services.lineage_report import lineage_command

    try:
        text, ok = lineage_command(model_uri, default_tracking_uri(tracking_uri, config), as_json, verify)
    except TrainpipeError as exc:
        _fail(exc)
    typer.echo(text)
    if not ok:
        typer.echo("trainpipe: error: lineage verification failed (see the verify line)", err=True)
        raise typer.Exit(3)


@app.command()
def promote(
    model_uri: str = typer.Argument(..., help="models:/<name>/<version>: the version to serve"),
    reason: str = typer.Option(
        ..., "--reason", help="why it may serve (or, with --reject, why not): goes into the tags and the audit log"
    ),
    alias: str = typer.Option(None, help="the serving alias (default: the config's alias, else champion)"),
    reject: bool = typer.Option(False, "--reject", help="record a rejection instead: nothing moves"),
    approver: str = typer.Option(
        None, help="who decided (default: TRAINPIPE_IDENTITY, the service account, or the OS user)"
    ),
    tracking_uri: str = typer.Option(
        None, help="MLflow tracking URI (default: MLFLOW_TRACKING_URI, else the config's)"
    ),
    config: Path = typer.Option(
        None, "--config", "-c", help="pipeline config (default: TRAINPIPE_CONFIG, ./pipeline.yaml, the demo's)"
    ),
    as_json: bool = typer.Option(
        False, "--json", help="print what was done as one JSON line (the Airflow task's XCom)"
    ),
    error_record: Path = typer.Option(
        None, help="where to write the error record JSON (component, exit_code, message) when it fails"
    ),
) -> None:
    """Move the serving alias to a version a person approved (with require_approval, register_model
    registers the challenger only). The version must carry a passed gate decision and verify against
    its signature; who, when and why go into its tags and the audit log.

    Exit codes: 0 promoted (or rejection recorded), 2 bad URI or unknown version, 4 its gate did not
    pass, 7 its model fails its signature, 75 MLflow unreachable.
    """
    from trainpipe.contract.policy import load_policy
    from trainpipe.services import promote as promote_mod

    try:
        cfg_path = default_config(config, required=False)
        cfg = None
        if cfg_path is not None:
            from trainpipe.pipelines.config import load_pipeline_config

            cfg = load_pipeline_config(str(cfg_path))
            _apply_policy(cfg)
        record = promote_mod.promote(
            model_uri,
            reason,
            alias=alias or (cfg.alias if cfg else DEFAULT_ALIAS),
            decision="rejected" if reject else "approved",
            approver=approver,
            tracking_uri=default_tracking_uri(tracking_uri, config),
            policy=load_policy(),
        )
    except TrainpipeError as exc:
        _fail(exc, error_record, "promote")
    if as_json:
        import json

        typer.echo(promote_mod.summary(record), err=True)
        typer.echo(json.dumps(record, sort_keys=True))
    else:
        typer.echo(promote_mod.summary(record))


audit_app = typer.Typer(
    no_args_is_help=True,
    help="The audit trail: an append-only, hash-chained log of every execution, gate decision and alias change.",
)
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

            raise InputError(
                "audit_log: no log given, and neither TRAINPIPE_AUDIT_LOG nor the policy's audit_log is set"
            )
        summary = audit.verify(Path(path))
    except TrainpipeError as exc:
        _fail(exc)
    typer.echo(f"trainpipe: audit log {path}: intact, {summary['records']} records, head {summary['head']}")


@app.command()
def demo(
    workspace: Path = typer.Option(Path(".trainpipe/demo"), help="where the demo keeps its data and state"),
    engine: str = typer.Option("kfp-local", help="kfp-local or airflow-local"),
    profile: str = typer.Option(
        "cpu",
        help="hardware profile: cpu, or cpu-smb (the model is also optimized for CPU serving: ONNX, int8, pruned)",
    ),
) -> None:
    """Write scikit-learn's digits as raw CSV and run the reference pipeline on it."""
    from trainpipe.demo import write_demo_config

    config = write_demo_config(workspace, profile=profile)
    typer.echo(f"trainpipe: demo config {config}", err=True)
    run_pipeline(config, engine, dry_run=False)


if __name__ == "__main__":  # pragma: no cover
    app()
