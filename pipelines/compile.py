"""Compile the reference pipeline to KFP IR YAML, and run it on the local runner."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from trainpipe.pipelines.config import PipelineConfig


def compile_pipeline(
    output: str | os.PathLike[str],
    profile: str = "cpu",
    policy: Any = None,
    pipeline_root: str | None = None,
    trusted_code: str = "",
    optimize: Any = None,
    require_approval: bool = False,
    tune: dict[str, Any] | None = None,
    defaults: dict[str, Any] | None = None,
) -> Path:
    """Compile the reference pipeline for a hardware profile to ``output``.

    Args:
        output: Where the IR YAML goes.
        profile: A built-in profile name or a profile YAML.
        policy: A :class:`~trainpipe.contract.policy.Policy` (default: ``TRAINPIPE_POLICY``). A
            non-empty policy is put on every task, which enforces it at run time.
        pipeline_root: Where KFP keeps the run's artifacts (default: the cluster's).
        trusted_code: The team package evaluate_model may import to rebuild the team's model.
        optimize: The config's ``optimize`` section (:class:`~trainpipe.pipelines.config.OptimizeSettings`;
            default: its defaults): whether, and with which settings, optimize_model runs between the
            gate and register_model under this profile.
        require_approval: register_model registers the challenger only; ``trainpipe promote``
            moves the serving alias after a person approves (fixed at compile time: a run's
            parameters cannot skip the approval).
        tune: tune_model's settings and workers (``PipelineConfig.tune_settings()``): tune first.
        defaults: The pipeline parameters' defaults (:func:`cluster_defaults`); the others keep the specs'.

    Raises:
        InputError: the pipeline root is outside the policy's locations, regions or encryption.
    """
    from kfp import compiler

    from trainpipe.contract import policy as policy_mod
    from trainpipe.pipelines.training_pipeline import build_pipeline
    from trainpipe.services.profiles import get_profile

    policy = policy if policy is not None else policy_mod.load_policy()
    hw = get_profile(profile)
    if pipeline_root:
        policy_mod.check_endpoint("pipeline_root", pipeline_root, policy)
        policy_mod.check_store("pipeline_root", pipeline_root, policy.sse, policy=policy)
    from trainpipe.pipelines.config import OptimizeSettings

    settings = (optimize if optimize is not None else OptimizeSettings()).for_profile(hw)
    out = Path(output)
    out.parent.mkdir(parents=True, exist_ok=True)
    pipeline = build_pipeline(
        hw,
        policy=policy,
        pipeline_root=pipeline_root,
        trusted_code=trusted_code,
        optimize=settings,
        require_approval=require_approval,
        tune=tune,
        defaults=defaults,
    )
    compiler.Compiler().compile(pipeline, package_path=str(out))
    return out


#: Hosts that name the machine a URI is written on.
_THIS_HOST = ("localhost", "127.0.0.1", "::1", "0.0.0.0")


def on_this_machine(place: Any) -> bool:
    """Whether a place (a :data:`~trainpipe.pipelines.config.PLACES` value, a tune storage) is this machine's:
    a path, a ``file://`` URI, a SQLite file, or a URI of localhost. A cluster's pods cannot reach it."""
    if not isinstance(place, str) or not place or place.startswith("builtin:"):
        return False
    scheme, sep, rest = place.partition("://")
    if not sep:
        return True  # a path: the config made a relative one absolute
    if scheme.lower() == "file" or scheme.lower().startswith("sqlite"):
        return True
    from urllib.parse import urlsplit

    try:
        host = urlsplit(place).hostname
    except ValueError:
        return False
    return host is not None and (host in _THIS_HOST or host.startswith("127."))


def holds_a_secret(place: Any) -> bool:
    """Whether a place is a URI with a password in it (``postgresql://user:pw@host/db``): never compiled in, as no
    secret goes into a compiled pipeline; a run passes it (or the pod's environment holds it)."""
    if not isinstance(place, str) or "://" not in place:
        return False
    from urllib.parse import urlsplit

    try:
        return urlsplit(place).password is not None
    except ValueError:
        return False


def left_to_the_run(place: Any) -> bool:
    """A place a compiled pipeline takes no default for: this machine's, or one holding a password."""
    return on_this_machine(place) or holds_a_secret(place)


def cluster_defaults(config: PipelineConfig) -> tuple[dict[str, Any], dict[str, str]]:
    """The pipeline parameters' defaults a config compiles in: its values, as ``trainpipe schedule`` passes them
    to a run (:meth:`PipelineConfig.pipeline_arguments`), but a place on this machine (:func:`on_this_machine`),
    which the parameter takes no default for: a run must pass it.

    Returns:
        The defaults by parameter name (``REQUIRED`` for a place left to the run), and those places' values.
    """
    from trainpipe.faces.surface import REQUIRED
    from trainpipe.pipelines.config import PLACES

    def kfp_default(value: Any) -> Any:  # KFP takes no None in a default: an unset key of a section is left out
        if isinstance(value, dict):
            return {k: kfp_default(v) for k, v in value.items() if v is not None}
        return [kfp_default(v) for v in value] if isinstance(value, list) else value

    values = {name: kfp_default(value) for name, value in config.pipeline_arguments().items()}
    local = {name: values[name] for name in PLACES if left_to_the_run(values[name])}
    return {**values, **dict.fromkeys(local, REQUIRED)}, local


def unchecked_functions(config: PipelineConfig) -> list[str]:
    """The team's training functions that cannot be imported here: their ``train_config`` (and tune's space)
    could not be checked against the config they declare; train_model checks it when its step runs."""
    from trainpipe.training.config_types import importable

    tuned = config.tune.train.get("train_function") if config.tune is not None else None
    functions = dict.fromkeys(f for f in (config.train.train_function, tuned) if f)
    return [spec for spec in functions if not importable(spec)]


def compile_config(
    config: PipelineConfig,
    output: str | os.PathLike[str],
    profile: str | None = None,
    policy: Any = None,
    pipeline_root: str | None = None,
) -> tuple[Path, list[str]]:
    """Compile the pipeline a config describes, for a cluster: the config's values are its parameters'
    defaults (:func:`cluster_defaults`), so a run with the defaults trains what the config says. A place on this
    machine is left for the run to pass: a parameter of the same name, or ``tune_storage`` for the tune storage
    (by default the workspace's SQLite file, which the cluster's tune_model pods could not share).

    Args:
        config: A resolved pipeline config.
        output: Where the IR YAML goes.
        profile: The hardware profile (default: the config's).
        policy: The policy on every task (default: the config's, else ``TRAINPIPE_POLICY``).
        pipeline_root: Where KFP keeps the run's artifacts (default: the cluster's).

    Returns:
        The IR YAML's path, and one line for each thing the person compiling should know: the places on this
        machine left for the run to pass, the team functions whose config was not checked.

    Raises:
        InputError: what :func:`compile_pipeline` refuses.
    """
    from trainpipe.faces.surface import REQUIRED

    defaults, local = cluster_defaults(config)
    tune = config.tune_settings()
    if tune is not None and left_to_the_run(tune["storage"]):  # unset: the workspace's SQLite file
        local["tune_storage"] = tune["storage"]  # the run parameter of tune's storage (kfp_tasks.run_parameter)
        tune = {**tune, "storage": REQUIRED}
    out = compile_pipeline(
        output,
        profile or config.profile,
        policy=policy if policy is not None else config.effective_policy(),
        pipeline_root=pipeline_root,
        trusted_code=config.trusted_code(),
        optimize=config.optimize,
        require_approval=config.require_approval,
        tune=tune,
        defaults=defaults,
    )
    from trainpipe.contract.text import redact

    notes = []
    if local:
        shown = ", ".join(f"{name}={redact(value)}" for name, value in local.items())
        notes.append(
            f"places on this machine or holding a password not compiled in, so a run must pass them as parameters "
            f"(a cluster's pods cannot read this machine; no secret goes into a compiled pipeline): {shown}"
        )
    from trainpipe.training.config_types import unchecked

    notes += [f"warning: {unchecked(spec, 'here')}" for spec in unchecked_functions(config)]
    return out, notes


GOLDEN_DIR = Path(__file__).resolve().parent / "golden"
COMPONENTS_DIR = Path(__file__).resolve().parents[1] / "components"


def export_components(
    directory: str | os.PathLike[str], in_tree: bool = False, names: Iterable[str] | None = None
) -> list[Path]:
    """Compile every component's KFP face (or those ``names`` says) to a reusable spec YAML.

    A team that does not install trainpipe loads one with
    ``kfp.components.load_component_from_file``. ``in_tree`` writes
    ``<directory>/<name>/component.yaml`` (the copies versioned in this repository);
    otherwise ``<directory>/<name>.yaml``. Every component is found from its folder
    (``trainpipe.COMPONENTS``), whether or not the reference pipeline runs it.

    Raises:
        InputError: a name in ``names`` is not a component's.
    """
    from kfp import compiler

    from trainpipe import COMPONENTS
    from trainpipe.contract.errors import InputError
    from trainpipe.contract.imports import import_face

    chosen = list(COMPONENTS if names is None else names)
    unknown = [n for n in chosen if n not in COMPONENTS]
    if unknown:
        raise InputError(f"component: {', '.join(map(repr, unknown))} is not one of {', '.join(COMPONENTS)}")
    written = []
    for name in chosen:
        face = getattr(import_face(name, "kfp_component"), name)
        out = Path(directory) / name / "component.yaml" if in_tree else Path(directory) / f"{name}.yaml"
        out.parent.mkdir(parents=True, exist_ok=True)
        compiler.Compiler().compile(face, package_path=str(out))
        written.append(out)
    return written


def validate_pipeline_yaml(path: str | os.PathLike[str]) -> None:
    """Check a compiled pipeline against the KFP pipeline spec (protobuf, unknown fields rejected).

    Raises:
        InputError: the file is not a valid PipelineSpec (plus an optional PlatformSpec).
    """
    import yaml
    from google.protobuf import json_format
    from kfp.pipeline_spec import pipeline_spec_pb2

    from trainpipe.contract.errors import InputError

    docs = [d for d in yaml.safe_load_all(Path(path).read_text(encoding="utf-8")) if d]
    if not docs:
        raise InputError(f"pipeline: {path} is empty")
    try:
        json_format.ParseDict(docs[0], pipeline_spec_pb2.PipelineSpec())
        for doc in docs[1:]:
            json_format.ParseDict(doc, pipeline_spec_pb2.PlatformSpec())
    except json_format.ParseError as exc:
        raise InputError(f"pipeline: {path} is not a valid KFP pipeline spec: {exc}") from None


def run_local(config: PipelineConfig, runner: Any = None, pipeline_root: str | Path | None = None) -> dict[str, Any]:
    """Run the pipeline end to end on a ``kfp.local`` runner: ``SubprocessRunner`` in this environment unless
    another is given (``DockerRunner``: each task in its image; it mounts ``pipeline_root``, which then must hold
    everything the tasks read, as the workspace does).

    Returns:
        The register step's outputs and where the run's artifacts lie.
    """
    from kfp import local

    from trainpipe.pipelines.training_pipeline import build_pipeline
    from trainpipe.services.profiles import get_profile

    root = Path(pipeline_root) if pipeline_root is not None else Path(config.workspace) / "kfp-local"
    root.mkdir(parents=True, exist_ok=True)
    local.init(runner=runner or local.SubprocessRunner(use_venv=False), pipeline_root=str(root), raise_on_error=True)
    # kfp.local honours retry policies but cannot tell a permanent exit code from a
    # transient one: locally, wait 1 s (not 30 s) before retrying, so a failed suite
    # stops the run in seconds.
    profile = get_profile(config.profile).model_copy(update={"retry_backoff_s": 1})
    pipeline = build_pipeline(
        profile,
        trusted_code=config.trusted_code(),
        optimize=config.optimize.for_profile(profile),
        require_approval=config.require_approval,
        tune=config.tune_settings(),
        cluster=False,  # kfp.local's runners ignore the Kubernetes platform settings
    )
    task = pipeline(**config.pipeline_arguments())
    return {"pipeline_root": str(root), "outputs": getattr(task, "outputs", {})}
