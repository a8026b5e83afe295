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
    pipeline = build_pipeline(get_profile(config.profile))
    task = pipeline(**config.pipeline_arguments())
    return {"pipeline_root": str(root), "outputs": getattr(task, "outputs", {})}
