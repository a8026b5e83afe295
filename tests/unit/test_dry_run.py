"""The dry run's parts, in process: the empty values a dry step reports, and what it records."""

from __future__ import annotations

import importlib
import json
from typing import Literal

import pytest
from pydantic import BaseModel, Field

from trainpipe import COMPONENTS
from trainpipe.contract import dry
from trainpipe.contract.runtime import Runtime

pytestmark = pytest.mark.unit


class Inner(BaseModel):
    n: int
    tag: str = "x"


class Outer(BaseModel):
    name: str
    ratio: float
    flag: bool
    kind: Literal["a", "b"]
    maybe: int | None
    items: list[int]
    table: dict[str, float]
    inner: Inner
    kept: int = 7
    made: list[str] = Field(default_factory=lambda: ["d"])


def test_a_stub_has_the_given_values_the_defaults_and_empty_values_for_the_rest():
    got = dry.stub(Outer, name="given")
    assert got.model_dump() == {
        "name": "given",
        "ratio": 0.0,
        "flag": False,
        "kind": "a",
        "maybe": None,
        "items": [],
        "table": {},
        "inner": {"n": 0, "tag": "x"},
        "kept": 7,
        "made": ["d"],
    }


def test_what_a_step_received_is_recorded_in_its_order_and_read_back_oldest_first(tmp_path, monkeypatch):
    monkeypatch.setenv(dry.ENV, str(tmp_path / "dry"))

    class Settings(BaseModel):
        train_config: dict = {}

    written = {"zeta": 1, "alpha": {"y": 2, "b": 3}, "big": 2**60, "lr": 1e-05}
    runtime = Runtime(hardware_profile="team.yaml", trusted_code=("acme",))
    dry.record("train_model", Settings(train_config=written), runtime, {"run_id": "r1"}, {"k": 1})
    dry.record("train_model", Settings(), runtime, {}, {"k": 2})
    first, second = dry.read(tmp_path / "dry", "train_model")
    assert json.dumps(first["settings"]["train_config"]) == json.dumps(written)
    assert (first["received"], second["received"]) == ({"k": 1}, {"k": 2})
    assert first["hardware_profile"] == "team.yaml" and first["trusted_code"] == ["acme"]
    assert first["run_id"] == "r1" and first["orchestrator"] == "manual"
    assert dry.read(tmp_path / "dry", "tune_model") == []


def test_a_step_that_trusts_more_than_the_platform_records_what_it_trusts(tmp_path, monkeypatch):
    """tune_model trusts the package of the function it trains, beside the platform's and its own setting's."""
    monkeypatch.setenv(dry.ENV, str(tmp_path))

    class Settings(BaseModel):
        pass

    runtime = Runtime(trusted_code=("platformpkg",))
    dry.record("tune_model", Settings(), runtime, {}, {"trusted_code": ["platformpkg", "acme"]})
    dry.record("evaluate_model", Settings(), runtime, {}, {})
    assert [r["trusted_code"] for r in (*dry.read(tmp_path, "tune_model"), *dry.read(tmp_path, "evaluate_model"))] == [
        ["platformpkg", "acme"],
        ["platformpkg"],
    ]


def test_outside_a_dry_run_there_is_no_folder(monkeypatch):
    monkeypatch.delenv(dry.ENV, raising=False)
    assert dry.folder() is None
    monkeypatch.setenv(dry.ENV, " ")
    assert dry.folder() is None


@pytest.mark.parametrize("name", COMPONENTS)
def test_every_component_has_a_dry_run_its_entrypoint_uses(name):
    """A component without one would do its work in a dry run (the scaffold's own components may)."""
    module = importlib.import_module(f"trainpipe.components.{name}.dry")
    assert callable(module.dry_run)
    source = importlib.util.find_spec(f"trainpipe.components.{name}.__main__").loader.get_source(
        f"trainpipe.components.{name}.__main__"
    )
    assert "dry=dry_run" in source


def test_the_summary_says_what_each_step_received_naming_a_profile_given_as_its_content(tmp_path, monkeypatch):
    monkeypatch.setenv(dry.ENV, str(tmp_path))

    class Settings(BaseModel):
        pass

    priced = Runtime(hardware_profile='{"name": "team-a100", "prices": {"currency": "EUR"}}', trusted_code=("acme",))
    dry.record("validate_data", Settings(), Runtime(), {}, {})
    dry.record(
        "train_model", Settings(), priced, {}, {"train_function": "acme.train:fit", "prices": {"currency": "EUR"}}
    )
    assert dry.summarize(tmp_path).splitlines() == [
        "validate_data    : hardware profile local",
        "train_model      : hardware profile team-a100; trains acme.train:fit; priced in EUR; trusts acme",
        f"what each received: {tmp_path}",
    ]
