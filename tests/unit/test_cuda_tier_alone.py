"""The CUDA tier collects with the package, torch and pytest alone (issue: a GPU image has no Sybil).

The root conftest loaded the docs' plugin, which imports Sybil, a dev extra that a team's CUDA image lacks, so
``python3 -m pytest tests/cuda -m cuda`` stopped at collection there. Here a fresh interpreter runs the tier's
collection with Sybil made unimportable (as absent), outside CI, and must collect the tier's tests.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.unit

WITHOUT_SYBIL = """
import sys
sys.modules["sybil"] = None  # import sybil raises ImportError, as where it is not installed
import pytest
sys.exit(pytest.main(["tests/cuda", "-m", "cuda", "--collect-only", "-q", "-p", "no:cacheprovider", "-p", "no:xdist"]))
"""


def test_the_cuda_tier_collects_without_sybil():
    """A fresh interpreter collects the tier (a few seconds on a quiet machine: pytest and torch import)."""
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "PYTEST_ADDOPTS", "PYTEST_XDIST_WORKER")}
    proc = subprocess.run(
        [sys.executable, "-c", WITHOUT_SYBIL], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert "tests/cuda/test_gpu.py::" in proc.stdout
    assert "sybil" not in (proc.stdout + proc.stderr).lower()
