"""Compile the reference pipeline to KFP IR YAML, and run it on the local runner."""

from __future__ import annotations

import os
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

    Raises:
        InputError: the pipeline root is outside the policy's locations, regions or encryption.
    """
    from kfp import compiler

    from trainpipe.contract import policy as policy_mod
    from trainpipe.pipelines.training_pipeline import build_pipeline
    from trainpipe.profiles import get_profile

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
    )
    compiler.Compiler().compile(pipeline, package_path=str(out))
    return out


GOLDEN_DIR = Path(__file__).resolve().parent / "golden"
COMPONENTS_DIR = Path(__file__).resolve().parents[1] / "components"


def export_components(directory: str | os.PathLike[str], in_tree: bool = False) -> list[Path]:
    """Compile every component's KFP face to a reusable spec YAML.

    A team that does not install trainpipe loads one with
    ``kfp.components.load_component_from_file``. ``in_tree`` writes
    ``<directory>/<name>/component.yaml`` (the copies versioned in this repository);
    otherwise ``<directory>/<name>.yaml``.
    """
    from kfp import compiler

    from trainpipe import COMPONENTS
    from trainpipe.pipelines import training_pipeline  # it imports every component's KFP face

    written = []
    for name in COMPONENTS:
        face = getattr(training_pipeline, name)
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


def run_local(config: PipelineConfig) -> dict[str, Any]:
    """Run the pipeline end to end on ``kfp.local.SubprocessRunner`` in this environment.

    Returns:
        The register step's outputs and where the run's artifacts lie.
    """
    from kfp import local

    from trainpipe.pipelines.training_pipeline import build_pipeline
    from trainpipe.profiles import get_profile

    root = Path(config.workspace) / "kfp-local"
    root.mkdir(parents=True, exist_ok=True)
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(root), raise_on_error=True)
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
    )
    task = pipeline(**config.pipeline_arguments())
    return {"pipeline_root": str(root), "outputs": getattr(task, "outputs", {})}
