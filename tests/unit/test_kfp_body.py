"""A component function's body, as KFP ships it into the container: it starts its step with the same
command the face's settings give, and only then imports the face (its spec's models), so the two load
side by side. Each body here is the generated source itself, run with stand-in artifacts; the step's
process is replaced by a recorder (what it would have been started with, what was imported by then)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainpipe import COMPONENTS
from trainpipe.faces import command, surface
from trainpipe.faces.kfp_face import DATASET_MD5, RUN_ID, Face

pytestmark = pytest.mark.unit


def _face(name: str) -> Face:
    import importlib

    return importlib.import_module(f"trainpipe.components.{name}.kfp_component").FACE


def _function(face: Face) -> Any:
    namespace: dict[str, Any] = {}
    exec("from typing import NamedTuple\nfrom kfp.dsl import *\n", namespace)  # noqa: S102 (as KFP's executor does)
    exec(face.source(), namespace)  # noqa: S102 (the body under test)
    return namespace[face.name]


def _arguments(face: Face, tmp_path: Any, given_values: dict[str, Any]) -> dict[str, Any]:
    """Every argument KFP would pass: a stand-in for each artifact (a path and metadata), each setting's
    KFP default or a value of its type where the spec has none, then ``given_values``."""
    args: dict[str, Any] = {}
    for a in face.artifacts:
        args[a.name] = None if a.optional else types.SimpleNamespace(path=str(tmp_path / a.name), metadata={})
    for p in face.settings:
        args[p.name] = surface.UNSET[p.type] if p.default is surface.REQUIRED else p.default
        if p.default is surface.REQUIRED and p.type is str:
            args[p.name] = "x"
    if face.reads_snapshot:
        args[DATASET_MD5] = ""
    args[RUN_ID] = "run-1"
    args.update(given_values)
    return args


def _started(face: Face, arguments: dict[str, Any], monkeypatch: Any) -> list[str]:
    """The command the body starts its step with (the step then fails with 3: the body exits with it)."""
    seen: list[list[str]] = []

    def recorder(cmd: list[str], env: dict, emit: Any, on_start: Any = None, **popen: Any) -> tuple[int, str]:
        seen.append(cmd)
        if on_start is not None:
            on_start(None)
        return 3, ""

    monkeypatch.setattr(command, "stream", recorder)
    with pytest.raises(SystemExit) as exited:
        _function(face)(**arguments)
    assert exited.value.code == 3
    (cmd,) = seen
    return cmd


def _as_the_spec_reads_them(face: Face, arguments: dict[str, Any]) -> list[str]:
    """The flags the settings give when read with the spec (what the face did before its body read them alone)."""
    settings_ = {
        a.field: None if arguments[a.name] is None else arguments[a.name].path for a in face.artifacts if a.field
    }
    settings_.update(surface.from_kfp({p.name: arguments[p.name] for p in face.settings}, face.params))
    return command.settings_to_flags(settings_)


def _flags(cmd: list[str]) -> dict[str, str]:
    """The settings' flags of an entrypoint command, by name (their order is the function's)."""
    start = cmd.index("--error-record") + 2
    rest = cmd[start:]
    return dict(zip(rest[::2], rest[1::2], strict=True))


@pytest.mark.parametrize("name", COMPONENTS)
def test_each_body_starts_its_step_with_the_settings_the_spec_reads(name, tmp_path, monkeypatch):
    face = _face(name)
    arguments = _arguments(face, tmp_path, {})
    monkeypatch.delenv("TRAINPIPE_FAILURE_FILE", raising=False)
    cmd = _started(face, arguments, monkeypatch)
    assert cmd[1:3] == ["-m", f"trainpipe.components.{name}"] and cmd[cmd.index("--run-id") + 1] == "run-1"
    want = _as_the_spec_reads_them(face, arguments)
    assert _flags(cmd) == dict(zip(want[::2], want[1::2], strict=True))


_VALUES = {
    int: st.integers(-3, 3),
    float: st.sampled_from([0.0, 0.5, -1.0]),
    str: st.sampled_from(["", "a", '{"k": 1}']),
    bool: st.booleans(),
    dict: st.sampled_from([{}, {"a": 1}]),
    list: st.sampled_from([[], ["a"]]),
}


@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_the_body_reads_any_value_as_the_spec_does(data):
    """Stand-ins (``""``, ``0``, ``{}``) and plain values, on every setting of every face: the body, which
    has only the names compiled into it, reads them as the spec would (None again where the spec's default is)."""
    face = _face(data.draw(st.sampled_from(COMPONENTS)))
    values = {p.name: data.draw(_VALUES[p.type]) for p in face.settings}
    assert surface.from_kfp_values(values, face.unset()) == surface.from_kfp(values, face.params)


PROBE = """
import json, os, sys, types
from trainpipe.faces import command
source, name, out = sys.argv[1], sys.argv[2], sys.argv[3]
seen = {}
def recorder(cmd, env, emit, on_start=None, **popen):
    seen["at_start"] = sorted(m for m in sys.modules if m.startswith(("trainpipe.components.", "pydantic")))
    on_start(None)
    seen["after"] = sorted(m for m in sys.modules if m.startswith("trainpipe.components."))
    return 0, json.dumps({"data_md5": "m", "rows": 1, "suite_name": "s", "docs_page": "index.html"})
command.stream = recorder
os.makedirs(os.path.join(out, "validated"))
open(os.path.join(out, "validated", "index.html"), "w").close()
namespace = {}
exec("from typing import NamedTuple\\nfrom kfp.dsl import *\\n", namespace)
exec(source, namespace)
art = lambda n: types.SimpleNamespace(path=os.path.join(out, n), metadata={})
namespace[name](data=art("data"), validated=art("validated"), report=art("report.html"), run_id="r")
seen["published"] = os.path.isfile(os.path.join(out, "report.html"))
print(json.dumps(seen))
"""


def test_the_step_starts_before_the_face_and_its_spec_are_imported(tmp_path):
    """In a fresh interpreter, as in the task's container: nothing of the component, nor pydantic (which its
    spec's models are built with), is imported when its step starts; the face is by the time the step has
    ended, and its publish runs (the report copied)."""
    env = dict(os.environ, _KFP_RUNTIME="true")
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, _face("validate_data").source(), "validate_data", str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["at_start"] == [], seen
    assert "trainpipe.components.validate_data.kfp_component" in seen["after"]
    assert "trainpipe.components.validate_data.spec" in seen["after"] and seen["published"]


def test_a_body_compiled_before_still_runs_its_step_through_the_face(tmp_path, monkeypatch):
    """A pipeline compiled by an earlier release ships ``FACE.run(locals())``, with ``FACE`` among the locals:
    the same command, nothing of the body's own names taken as a setting."""
    face = _face("evaluate_model")
    arguments = _arguments(face, tmp_path, {"tie_tolerance": 0.5, "model_name": ""})
    seen: list[list[str]] = []

    def recorder(cmd: list[str], env: dict, emit: Any, on_start: Any = None, **popen: Any) -> tuple[int, str]:
        seen.append(cmd)
        return 3, ""

    monkeypatch.setattr(command, "stream", recorder)
    with pytest.raises(SystemExit):
        face.run({**arguments, "FACE": face})
    want = _as_the_spec_reads_them(face, arguments)
    assert _flags(seen[0]) == dict(zip(want[::2], want[1::2], strict=True))
