"""MLflow connection helpers shared by train_model, evaluate_model and register_model.

mlflow is imported inside the functions. Credentials come only from MLflow's own
environment variables (``MLFLOW_TRACKING_TOKEN``, ``MLFLOW_TRACKING_USERNAME`` …),
never from component arguments, so they never reach a compiled pipeline.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainpipe.contract.errors import InputError, NotPermitted, ServiceUnavailable, TrainpipeError
from trainpipe.contract.text import redact

if TYPE_CHECKING:  # pragma: no cover
    from trainpipe.contract.policy import Policy

#: A run id: the training's MLflow run is nested under it (tune_model's study run sets it for its trials).
PARENT_RUN_ENV = "TRAINPIPE_MLFLOW_PARENT_RUN"
#: The name train_model gives its MLflow run (a study names each trial's run ``trial-<n>``).
RUN_NAME_ENV = "TRAINPIPE_MLFLOW_RUN_NAME"


def resolve_tracking_uri(uri: str | None, policy: Policy | None = None) -> str:
    """The tracking URI to use: the setting, else ``MLFLOW_TRACKING_URI``.

    A bare path or ``sqlite:///relative`` is made absolute, so every step of a run
    (each in its own working directory) talks to the same store. Plain ``http://`` off
    loopback is refused unless ``policy`` allows the host (a step passes the policy it runs
    under; without one, the one in force).

    Raises:
        InputError: neither is set, or the scheme is not one MLflow serves.
    """
    uri = uri or os.environ.get("MLFLOW_TRACKING_URI", "")
    if not uri:
        raise InputError("tracking_uri: not set, and MLFLOW_TRACKING_URI is empty")
    if uri.startswith("sqlite:///"):
        path = uri[len("sqlite:///") :]
        return "sqlite:///" + str(Path(path).resolve())
    if uri.startswith("http://"):
        from trainpipe.contract.policy import check_endpoint

        check_endpoint("tracking_uri", uri, policy)
    if uri.startswith(("http://", "https://", "postgresql://", "postgresql+psycopg2://", "mysql://", "databricks")):
        return uri
    if "://" not in uri:
        raise InputError(f"tracking_uri: {uri!r} is not a URI (use sqlite:///path/mlflow.db or http(s)://host)")
    raise InputError(f"tracking_uri: unsupported scheme in {redact(uri)!r}")


def default_artifact_location(uri: str) -> str | None:
    """Where a new experiment keeps artifacts when the store is a local SQLite file.

    A tracking server decides for itself (None); for ``sqlite:///dir/x.db`` it is
    ``dir/mlartifacts``, never the current directory.
    """
    if uri.startswith("sqlite:///"):
        return (Path(uri[len("sqlite:///") :]).parent / "mlartifacts").resolve().as_uri()
    return None


def probe(uri: str | None, policy: Policy | None = None) -> None:
    """A quick check that a tracking server answers (``/health``), without importing mlflow.

    Raises:
        ServiceUnavailable: an http(s) server does not answer (a store that is a database or a
            file is checked when it is opened).
    """
    import urllib.error
    import urllib.request

    resolved = resolve_tracking_uri(uri, policy)
    if not resolved.startswith(("http://", "https://")):
        return
    try:
        with urllib.request.urlopen(resolved.rstrip("/") + "/health", timeout=10):
            return
    except urllib.error.HTTPError:
        return  # it answered (a proxy or the auth app may refuse /health): connect() says more
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise ServiceUnavailable(f"tracking_uri: MLflow at {redact(resolved)!r} is unavailable: {reason}") from None


#: Where an empty SQLite tracking store, migrated once by this machine's MLflow, is kept to seed new ones.
STORE_CACHE_ENV = "TRAINPIPE_CACHE_DIR"


def _empty_store_template() -> Path:
    """An empty SQLite store of this MLflow's schema (every migration run, no experiment yet), made once per
    MLflow and SQLAlchemy version under the user's cache folder: MLflow's own migrations of a new SQLite file
    take seconds (about 1,800 statements), which the first step of every new workspace paid."""
    import mlflow
    import sqlalchemy
    from mlflow.store.db.utils import _initialize_tables

    cache = Path(os.environ.get(STORE_CACHE_ENV) or Path.home() / ".cache" / "trainpipe") / "mlflow-stores"
    template = cache / f"empty-mlflow-{mlflow.__version__}-sqlalchemy-{sqlalchemy.__version__}.db"
    if not template.is_file():
        cache.mkdir(parents=True, exist_ok=True)
        tmp = cache / f".{template.name}.{os.getpid()}.tmp"
        engine = sqlalchemy.create_engine(f"sqlite:///{tmp}")
        try:
            _initialize_tables(engine)  # what MLflow runs on an empty database, the default experiment aside
        finally:
            engine.dispose()
        os.replace(tmp, template)  # whole or absent: two makers at once each rename a whole one
    return template


def seed_sqlite_store(resolved: str) -> None:
    """Start a SQLite store that does not exist yet as a copy of the empty one (:func:`_empty_store_template`);
    MLflow then opens it as one it made itself (its default experiment is created on open, with this store's
    artifact root). A store that exists is never touched, one made meanwhile by another step is kept, and a
    template that cannot be made leaves MLflow to migrate the new file as before."""
    import shutil

    if not resolved.startswith("sqlite:///"):
        return
    path = Path(resolved[len("sqlite:///") :])
    if path.exists() or not path.parent.is_dir():
        return
    try:
        template = _empty_store_template()
    except Exception:  # noqa: BLE001 (an optimisation only: MLflow makes the store as it always did)
        return
    tmp = path.with_name(f".{path.name}.{os.getpid()}.seed")
    try:
        shutil.copyfile(template, tmp)
        os.link(tmp, path)  # only where no store is yet
    except OSError:
        pass  # made meanwhile by another step (FileExistsError), or a folder that takes no link: MLflow makes it
    finally:
        tmp.unlink(missing_ok=True)


def connect(uri: str | None, policy: Policy | None = None) -> Any:
    """Point MLflow at the tracking store and check it answers.

    Returns:
        An ``mlflow.MlflowClient``.

    Raises:
        ServiceUnavailable: the server does not answer (transient; retry).
    """
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "3")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # a task log is not a terminal
    resolved = resolve_tracking_uri(uri, policy)
    seed_sqlite_store(resolved)
    import mlflow

    mlflow.set_tracking_uri(resolved)
    client = mlflow.MlflowClient(tracking_uri=resolved)
    try:
        client.search_experiments(max_results=1)
    except Exception as exc:
        raise classify(exc, f"tracking_uri: MLflow at {redact(resolved)!r}", "is unavailable") from None
    return client


def http_status(exc: BaseException) -> int | None:
    """The HTTP status an MLflow client error carries, if any."""
    import re

    getter = getattr(exc, "get_http_status_code", None)
    status = getter() if callable(getter) else None
    code = getattr(exc, "error_code", "")
    if code in ("UNAUTHENTICATED",):
        return 401
    if code in ("PERMISSION_DENIED",):
        return 403
    match = re.search(r"error code (\d{3})", str(exc))
    if match:
        return int(match.group(1))
    return status if isinstance(status, int) else None


def classify(exc: BaseException, what: str, verb: str) -> TrainpipeError:
    """Map an MLflow client error to ours: refused credentials or rights are permanent (77),
    another 4xx is a bug or bad input (2), anything else is transient (75)."""
    status = http_status(exc)
    if status in (401, 403):
        return NotPermitted(
            f"{what} refused: {'credentials not accepted' if status == 401 else 'permission denied'} "
            f"(HTTP {status}; check MLFLOW_TRACKING_USERNAME/PASSWORD or TOKEN and the identity's rights)"
        )
    if status is not None and 400 <= status < 500 and status not in (408, 429):
        return InputError(f"{what} refused the request (HTTP {status}): {first_line(exc)}")
    return ServiceUnavailable(f"{what} {verb}: {first_line(exc)}")


def prepare_artifact_store(
    client: Any, policy: Policy, run_id: str | None = None, experiment_id: str | None = None
) -> str:
    """Check the run's artifact store against the policy and ask S3 to encrypt what is uploaded.

    The store must lie in the allowed locations and regions (the region of an S3 store is
    ``AWS_REGION``/``AWS_DEFAULT_REGION``, as boto3 reads it). With the policy's ``sse``,
    uploads to S3 carry the server-side encryption headers; when the policy requires
    encryption and none is configured, nothing is uploaded. A store the tracking server
    proxies (``mlflow-artifacts:``) is checked by that name.

    Args:
        client: An MLflow client.
        policy: The policy the step runs under.
        run_id: The run whose artifact URI is checked, or
        experiment_id: the experiment whose artifact location is (before a run exists).

    Returns:
        The artifact URI.

    Raises:
        InputError: the store is outside the policy.
    """
    import json as _json

    from trainpipe.contract import policy as policy_mod

    try:
        uri = (
            client.get_run(run_id).info.artifact_uri
            if run_id
            else client.get_experiment(experiment_id).artifact_location
        )
    except Exception as exc:
        raise classify(exc, "tracking_uri: MLflow", "did not answer") from None
    policy_mod.check_store("artifact store", uri, policy.sse, policy=policy)
    if uri.startswith("s3://"):
        extra = policy_mod.s3_upload_args(policy.sse, policy.sse_kms_key_id)
        if extra:
            os.environ["MLFLOW_S3_UPLOAD_EXTRA_ARGS"] = _json.dumps(extra)
        if os.environ.get("MLFLOW_S3_ENDPOINT_URL"):
            policy_mod.check_endpoint("MLFLOW_S3_ENDPOINT_URL", os.environ["MLFLOW_S3_ENDPOINT_URL"], policy)
    return uri


def ensure_experiment(client: Any, name: str, uri: str) -> str:
    """Get or create an experiment by name; returns its id."""
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    return client.create_experiment(name, artifact_location=default_artifact_location(resolve_tracking_uri(uri)))


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
