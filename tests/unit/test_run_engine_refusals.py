"""``trainpipe run`` refuses what the engine could not do before any step runs, a dry run too: a ``train.slurm``
section on kfp-local (the KFP face's pods reach no Slurm), or on airflow-local where this machine has no sbatch
(it submits from here). One line naming the field, exit 2, no engine started."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.unit


def _run(tmp_path: Path, engine: str, *extra: str, path: str | None = None):
    from typer.testing import CliRunner

    from trainpipe.app.cli import app

    config = tmp_path / "pipeline.yaml"
    config.write_text(
        yaml.safe_dump(
            {"data": "data.csv", "workspace": str(tmp_path / "ws"), "train": {"slurm": {"partition": "gpu"}}}
        )
    )
    env = {"PATH": path} if path is not None else {}
    return CliRunner().invoke(app, ["run", "--config", str(config), "--engine", engine, *extra], env=env)


@pytest.mark.parametrize("dry", [True, False])
def test_a_slurm_section_is_refused_on_kfp_local_before_any_step(tmp_path, dry):
    result = _run(tmp_path, "kfp-local", *(["--dry-run"] if dry else []))
    assert result.exit_code == 2, result.output
    said = result.output.strip().splitlines()
    assert len(said) == 1 and "'train.slurm': the kfp-local engine cannot reach Slurm" in said[0], result.output
    assert not (tmp_path / "ws" / "logs").exists()  # no engine started


def test_a_slurm_section_is_refused_on_airflow_local_where_no_sbatch_is_here(tmp_path):
    result = _run(tmp_path, "airflow-local", "--dry-run", path=str(tmp_path))
    assert result.exit_code == 2, result.output
    said = result.output.strip().splitlines()
    assert len(said) == 1 and "'train.slurm': airflow-local submits the job with sbatch" in said[0], result.output
