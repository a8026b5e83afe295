"""Feast's MLflow header plugin is deferred, not dropped: MLflow imports without Feast, and the header
Feast adds inside its own calls is still added."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys

import pytest

from trainpipe.contract import plugins

pytestmark = pytest.mark.unit


def test_importing_mlflow_after_trainpipe_loads_no_feast_and_registers_the_stand_in():
    code = (
        "import sys, trainpipe, mlflow\n"
        "from mlflow.tracking.request_header.registry import _request_header_provider_registry as r\n"
        "print(','.join(type(p).__name__ for p in r), 'feast' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["DatabricksRequestHeaderProvider,DefaultRequestHeaderProvider,FeastHeaders", "False"]


def test_the_stand_in_adds_feasts_header_exactly_when_feasts_token_is_set():
    stand_in = plugins.FeastHeaders()
    from feast.infra.data_sources.mlflow import auth

    assert not stand_in.in_context() and stand_in.request_headers() == {}
    token = auth._current_mlflow_token.set("t0k3n")
    try:
        assert stand_in.in_context()
        assert stand_in.request_headers() == {"Authorization": "Bearer t0k3n"}
    finally:
        auth._current_mlflow_token.reset(token)
    assert not stand_in.in_context()


def test_only_feasts_provider_is_replaced_and_other_groups_pass_through():
    feast = importlib.metadata.EntryPoint(name="feast", value=plugins.FEAST_PROVIDER, group=plugins.GROUP)
    other = importlib.metadata.EntryPoint(name="team", value="team.headers:Provider", group=plugins.GROUP)
    elsewhere = importlib.metadata.EntryPoint(name="x", value=plugins.FEAST_PROVIDER, group="other.group")

    def entry_points(**params):
        return importlib.metadata.EntryPoints(e for e in (feast, other, elsewhere) if e.group == params["group"])

    deferred = plugins._deferring(entry_points)
    assert list(deferred(group=plugins.GROUP)) == [plugins.STAND_IN, other]
    assert list(deferred(group="other.group")) == [elsewhere]
    assert plugins.STAND_IN.load() is plugins.FeastHeaders
