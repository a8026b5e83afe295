"""Compile the reference pipeline to KFP IR YAML, and run it on the local runner."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from trainpipe.pipelines.config import PipelineConfig


def compile_pipeline(output: str | os.PathLike[str], profile: str = "cpu") -> Path:
    """Compile the reference pipeline for a hardware profile to ``output``."""
    from kfp import compiler

    from trainpipe.pipelines.training_pipeline import build_pipeline
    from trainpipe.profiles import get_profile

    out = Path(output)
    out.parent.mkdir(parents=True, exist_ok=True)
    compiler.Compiler().compile(build_pipeline(get_profile(profile)), package_path=str(out))
    return out


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
    pipeline = build_pipeline(profile)
    task = pipeline(**config.pipeline_arguments())
    return {"pipeline_root": str(root), "outputs": getattr(task, "outputs", {})}
