"""The engines of ``trainpipe run``, each run as ``python -m trainpipe.app.runner ENGINE CONFIG``.

``trainpipe run`` starts this in a child process whose output goes to a log file, and shows the
terminal one line per step and the summary. The child runs under a lifeline
(:func:`~trainpipe.contract.lifeline.supervise`): when ``trainpipe run`` dies or is stopped, this process
is killed and every process it started stops (a step's entrypoint gets SIGTERM and checkpoints).
Each step tells it (``TRAINPIPE_FAILURE_FILE``) which step failed, with what line and code, when one does.

- ``kfp-local``: the reference pipeline on ``kfp.local.SubprocessRunner`` in this environment.
- ``airflow-local``: the training DAG under ``dag.test()``, with a SQLite metadata database in the
  workspace and the DAG files trainpipe installs (``trainpipe.dags``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def dags_folder() -> Path:
    """The folder of the DAG files trainpipe ships (``dags/`` of a checkout, ``trainpipe/dags`` installed)."""
    import trainpipe.dags

    return Path(trainpipe.dags.__file__).resolve().parent


#: What kfp's executor sets in a task's container (``kfp.dsl.component_factory``): ``kfp/__init__.py`` then skips
#: importing ``kfp.client``, ``kfp.components`` and ``kfp.dsl``.
KFP_RUNTIME = "_KFP_RUNTIME"


def import_kfp_without_its_client() -> None:
    """Import kfp's package as its executor does in a task's container, without ``kfp.client`` (the API server's
    client: kfp_server_api, the Kubernetes client, google-auth; most of a second here), which a local run never
    uses. The variable is set only while kfp's ``__init__`` runs, at this process's start, before any thread or
    child exists and before anything else imports kfp: ``kfp.dsl`` and ``kfp.local``, imported after, are whole,
    and no task inherits it."""
    if "kfp" in sys.modules:
        return
    before = os.environ.get(KFP_RUNTIME)
    os.environ[KFP_RUNTIME] = "true"
    try:
        import kfp  # noqa: F401
    finally:
        if before is None:
            del os.environ[KFP_RUNTIME]
        else:
            os.environ[KFP_RUNTIME] = before


def run_kfp_local(config_path: Path) -> int:
    import_kfp_without_its_client()
    from trainpipe.pipelines.compile import run_local
    from trainpipe.pipelines.config import load_pipeline_config

    run_local(load_pipeline_config(config_path))
    return 0


def run_airflow_local(config_path: Path) -> int:
    """The training DAG once under ``dag.test()``; 0 when the run succeeded."""
    from trainpipe.pipelines.config import load_pipeline_config

    cfg = load_pipeline_config(config_path)
    home = Path(cfg.workspace) / "airflow"
    home.mkdir(parents=True, exist_ok=True)
    folder = dags_folder()
    os.environ.update(
        {
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(folder),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "TRAINPIPE_CONFIG": str(config_path),
        }
    )
    from airflow.dag_processing.dagbag import DagBag
    from airflow.utils import db

    db.upgradedb()  # what `airflow db migrate` does (create on a first run, upgrade after an upgrade), in this process
    bag = DagBag(str(folder))
    if "trainpipe_training" not in bag.dags:
        print(f"trainpipe: the training DAG did not load from {folder}: {bag.import_errors}", file=sys.stderr)
        return 1
    run = bag.dags["trainpipe_training"].test()
    return 0 if str(run.state) in ("success", "DagRunState.SUCCESS") else 1


ENGINES = {"kfp-local": run_kfp_local, "airflow-local": run_airflow_local}


#: ``trainpipe run --dry-run`` (:data:`trainpipe.contract.dry.ENV`, whose module imports pydantic).
DRY_RUN_ENV = "TRAINPIPE_DRY_RUN"

#: The failure report's component when the engine refused the config before any step ran.
LOAD = "config"


def main(argv: list[str]) -> int:
    from trainpipe.contract.errors import TrainpipeError
    from trainpipe.faces.command import note_failure

    engine, config = argv[0], Path(argv[1])
    host = _warm_host()
    try:
        return ENGINES[engine](config)
    except TrainpipeError as exc:  # a refusal while loading the config or building the run: the user's one line
        print(f"trainpipe: error: {exc}", file=sys.stderr)
        note_failure(LOAD, exc.exit_code, str(exc))
        return exc.exit_code
    except Exception as exc:  # the engine's own report (kfp.local raises on a failed task) is in this log
        print(
            f"trainpipe: engine {engine} stopped: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
            file=sys.stderr,
        )
        return 1
    finally:
        if host is not None:
            from trainpipe.contract import warm

            warm.stop(host)


def _warm_host() -> object | None:
    """The steps' warm host (:mod:`~trainpipe.contract.warm`), started before the engine imports anything, so
    that it imports the steps' libraries on the second core meanwhile; none for a dry run (no step imports them)."""
    from trainpipe.contract import warm

    if os.environ.get(DRY_RUN_ENV) or os.environ.get(warm.HOST_ENV) == "off":
        return None
    host, os.environ[warm.HOST_ENV] = warm.start()
    return host


if __name__ == "__main__":
    from trainpipe.contract.entrypoint import exit_now

    # not module by module: tearing down Airflow's and kfp's modules took the airflow-local run 2 s after its end
    exit_now(main(sys.argv[1:]))
