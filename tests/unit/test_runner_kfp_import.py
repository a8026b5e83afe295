"""The kfp-local engine's process imports kfp as kfp's own executor does in a container: without ``kfp.client``
(which a local run never uses), with ``kfp.dsl`` and ``kfp.local`` whole, and without leaving ``_KFP_RUNTIME`` to
the tasks it starts. Each case runs in a fresh interpreter: the import happens once per process."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit

PROBE = """
import json, os, sys
from trainpipe.app import runner
runner.import_kfp_without_its_client()
from kfp import dsl, local
print(json.dumps({
    "client": "kfp.client" in sys.modules,
    "kubernetes": "kubernetes" in sys.modules,
    "env": os.environ.get("_KFP_RUNTIME"),
    "dsl": all(hasattr(dsl, n) for n in ("pipeline", "component", "importer", "If", "ParallelFor")),
    "local": hasattr(local, "SubprocessRunner"),
}))
"""


def _probe(env_value: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "_KFP_RUNTIME"}
    if env_value is not None:
        env["_KFP_RUNTIME"] = env_value
    proc = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_kfp_without_its_client_and_nothing_left_in_the_environment():
    assert _probe(None) == {"client": False, "kubernetes": False, "env": None, "dsl": True, "local": True}


def test_a_value_the_environment_had_is_given_back():
    assert _probe("false")["env"] == "false"


def test_the_local_engine_builds_its_pipeline_without_the_kubernetes_client(tmp_path):
    """The engine's whole build of the demo's pipeline (kfp.local's init, the pipeline's trace) loads neither."""
    code = PROBE.replace(
        "from kfp import dsl, local",
        "from kfp import dsl, local\n"
        "from trainpipe.pipelines.training_pipeline import build_pipeline\n"
        "from trainpipe.services.profiles import PROFILES\n"
        "build_pipeline(PROFILES['cpu'], cluster=False)",
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not seen["client"] and not seen["kubernetes"], seen
