"""Upload the compiled pipeline to Kubeflow Pipelines and schedule it, through ``kfp.Client``.

Auth follows kfp's own conventions and nothing is written to disk by trainpipe: inside a
cluster, kfp reads the service-account token (``KF_PIPELINES_SA_TOKEN_PATH``); outside,
pass a bearer token in the environment variable ``KFP_EXISTING_TOKEN`` (given to
``kfp.Client(existing_token=...)``), or rely on kfp's own credentials handling.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from trainpipe.contract.errors import InputError, ServiceUnavailable

TOKEN_ENV = "KFP_EXISTING_TOKEN"


def _check_host(host: str) -> None:
    if not host.startswith(("http://", "https://")):
        raise InputError(f"host: {host!r} is not an http(s) URL of the KFP API")
    from trainpipe.contract.policy import check_endpoint

    check_endpoint("host", host)


def client(host: str, namespace: str | None = None) -> Any:
    """A kfp.Client for ``host`` (token from ``KFP_EXISTING_TOKEN`` when set)."""
    import kfp

    _check_host(host)
    kwargs: dict[str, Any] = {"host": host}
    if namespace:
        kwargs["namespace"] = namespace
    if os.environ.get(TOKEN_ENV):
        kwargs["existing_token"] = os.environ[TOKEN_ENV]
    import warnings

    try:
        with warnings.catch_warnings():
            warnings.simplefilter(
                "ignore", FutureWarning
            )  # "only works with KFP v2.0.0-beta.2 and later": we target v2
            return kfp.Client(**kwargs)
    except Exception as exc:
        raise ServiceUnavailable(
            f"host: the KFP API at {host} did not answer: "
            f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
        ) from None


def _api_errors() -> tuple[type[BaseException], ...]:
    """What the API or the network raise: reported as one line; anything else is a bug and shows its traceback."""
    import kfp_server_api
    import urllib3

    return (kfp_server_api.ApiException, urllib3.exceptions.HTTPError, OSError)


def default_version() -> str:
    """trainpipe's version and the short git commit of the pipeline code, when known."""
    from trainpipe import __version__
    from trainpipe.contract.lineage import code_version

    commit = (code_version().get("git_commit") or "")[:10]
    return f"{__version__}-{commit}" if commit else __version__


def upload(
    package: str | os.PathLike[str],
    host: str,
    pipeline_name: str,
    version: str | None = None,
    namespace: str | None = None,
    description: str = "",
    kfp_client: Any | None = None,
) -> dict[str, str]:
    """Upload a compiled pipeline: a new pipeline, or a new version of an existing one.

    Returns:
        ``pipeline_id``, ``version_id``, ``version`` and whether the pipeline was ``created``.

    Raises:
        InputError: the package does not exist or is not a valid pipeline spec.
        ServiceUnavailable: the API server cannot be reached or refused the upload.
    """
    from trainpipe.pipelines.compile import validate_pipeline_yaml

    path = Path(package)
    if not path.is_file():
        raise InputError(f"package: {str(path)!r} does not exist (run `trainpipe compile -o {path}` first)")
    validate_pipeline_yaml(path)
    c = kfp_client or client(host, namespace)
    version = version or default_version()
    try:
        pipeline_id = c.get_pipeline_id(pipeline_name)
        created = pipeline_id is None
        if created:
            # An empty pipeline, then the version under its own name: exactly one version.
            import kfp_server_api

            body = kfp_server_api.V2beta1Pipeline(
                display_name=pipeline_name, description=description or None, namespace=namespace
            )
            pipeline_id = c._pipelines_api.pipeline_service_create_pipeline(pipeline=body).pipeline_id
        v = c.upload_pipeline_version(
            str(path), pipeline_version_name=version, pipeline_id=pipeline_id, description=description or None
        )
        return {
            "pipeline_id": pipeline_id,
            "version_id": v.pipeline_version_id,
            "version": version,
            "created": str(created).lower(),
        }
    except _api_errors() as exc:
        status = getattr(exc, "status", None)
        first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        if isinstance(status, int) and status == 409:
            raise InputError(
                f"version: {version!r} already exists for pipeline {pipeline_name!r}; pass another --version"
            ) from None
        raise ServiceUnavailable(f"host: uploading to {host} failed: {first_line}") from None


def schedule(
    host: str,
    pipeline_name: str,
    cron: str,
    experiment: str,
    job_name: str,
    params: dict[str, Any],
    version_id: str | None = None,
    namespace: str | None = None,
    enable_caching: bool = True,
    package: str | os.PathLike[str] | None = None,
    kfp_client: Any | None = None,
    service_account: str | None = None,
) -> dict[str, str]:
    """A recurring run on a cron schedule: of the pipeline's given (default: newest) uploaded
    version, or of a compiled ``package`` submitted with the run (needed to switch caching
    off: KFP applies a run's caching override to a package, not to an uploaded version).

    ``service_account`` is the Kubernetes service account every pod of each run uses (KFP sets
    it per run; kfp-kubernetes has no per-task setting)."""
    fields = cron.split()
    if len(fields) not in (5, 6):
        raise InputError(f"cron: {cron!r} is not a cron expression (5 or 6 fields, e.g. '0 0 3 * * *')")
    if len(fields) == 5:
        cron = "0 " + cron  # KFP's scheduler takes seconds first
    if not enable_caching and package is None:
        raise InputError(
            "caching: switching caching off for a schedule needs --package (KFP overrides caching in a submitted "
            "package only)"
        )
    c = kfp_client or client(host, namespace)
    try:
        if package is not None:
            from trainpipe.pipelines.compile import validate_pipeline_yaml

            if not Path(package).is_file():
                raise InputError(f"package: {str(package)!r} does not exist")
            validate_pipeline_yaml(package)
            exp = c.create_experiment(experiment, namespace=namespace)
            run = c.create_recurring_run(
                experiment_id=exp.experiment_id,
                job_name=job_name,
                cron_expression=cron,
                pipeline_package_path=str(package),
                params=params,
                enable_caching=enable_caching,
                max_concurrency=1,
                service_account=service_account,
            )
            return {"recurring_run_id": run.recurring_run_id, "pipeline_id": "", "version_id": "", "cron": cron}
        pipeline_id = c.get_pipeline_id(pipeline_name)
        if pipeline_id is None:
            raise InputError(f"pipeline_name: no pipeline {pipeline_name!r} on {host} (upload it first)")
        if not version_id:
            versions = (
                c.list_pipeline_versions(
                    pipeline_id=pipeline_id, sort_by="created_at desc", page_size=1
                ).pipeline_versions
                or []
            )
            if not versions:
                raise InputError(f"pipeline_name: {pipeline_name!r} has no versions")
            version_id = versions[0].pipeline_version_id
        exp = c.create_experiment(experiment, namespace=namespace)
        run = c.create_recurring_run(
            experiment_id=exp.experiment_id,
            job_name=job_name,
            cron_expression=cron,
            pipeline_id=pipeline_id,
            version_id=version_id,
            params=params,
            enable_caching=enable_caching,
            max_concurrency=1,
            service_account=service_account,
        )
    except _api_errors() as exc:
        first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ServiceUnavailable(f"host: scheduling on {host} failed: {first_line}") from None
    return {
        "recurring_run_id": run.recurring_run_id,
        "pipeline_id": pipeline_id,
        "version_id": version_id,
        "cron": cron,
    }
