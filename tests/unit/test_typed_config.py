"""A training function's typed config (a pydantic model for its ``config`` parameter): found without
importing the framework where it can be, passed to the function as the model's instance, and a
``train_config`` that does not fit it refused in one line where it is written: the CLI, a DAG's operator
(at import), a KFP pipeline's call of the face (at compile), a study's search space (before its first
trial). Tested by generation: misspelled and unknown keys, values of the wrong type, missing required keys."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainpipe.components.train_model.spec import TrainModelConfig
from trainpipe.contract.config import build
from trainpipe.contract.errors import InputError
from trainpipe.training import config_types

pytestmark = pytest.mark.unit

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TYPED = "teampkg.typed:train"
FIELDS = {"learning_rate", "hidden", "eps", "schedule"}


@pytest.fixture(autouse=True)
def team_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(FIXTURES))
    config_types.config_model.cache_clear()


def test_the_model_is_found_without_importing_the_framework():
    """A config imported from a light module is read from the function's source: torch stays unloaded."""
    code = (
        "import sys; from trainpipe.training.config_types import config_model; "
        f"m = config_model({TYPED!r}); print(m.__name__, 'torch' in sys.modules, 'teampkg.typed' in sys.modules)"
    )
    env = {**os.environ, "PYTHONPATH": str(FIXTURES)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    assert out.split() == ["TrainConfig", "False", "False"]


def test_each_shape_of_function_declares_what_it_says():
    from teampkg.typed_config import TrainConfig

    from trainpipe.training.builtin import BuiltinConfig

    assert config_types.config_model(TYPED) is TrainConfig
    assert config_types.config_model("teampkg.beside:train").__name__ == "Settings"  # defined beside it
    assert config_types.config_model("teampkg.echo:train") is None  # a dict: untyped
    assert config_types.config_model("teampkg.train:train") is None
    assert config_types.config_model("absent_pkg.mod:train") is None  # not installed here: the step checks
    assert config_types.config_model("builtin:mlp") is BuiltinConfig
    from trainpipe.training.torch import builtin as builtin_torch

    assert config_types.model_of_function(builtin_torch.cnn) is BuiltinConfig


def test_the_function_gets_the_models_instance_and_a_dict_function_the_dict():
    from teampkg import echo, typed
    from teampkg.typed_config import TrainConfig

    got = config_types.argument(typed.train, {"learning_rate": 1e-05, "hidden": [4]}, TYPED)
    assert isinstance(got, TrainConfig) and got.learning_rate == 1e-05 and got.eps == 1e-08
    assert config_types.argument(echo.train, {"b": 1, "a": 2}, "teampkg.echo:train") == {"b": 1, "a": 2}


def test_a_model_that_allows_extra_keys_takes_them():
    config_types.check("teampkg.beside:train", {"width": 4, "anything": [1]})
    with pytest.raises(InputError, match=r"train_config.width: Input should be a valid integer"):
        config_types.check("teampkg.beside:train", {"width": "4"})


# --- refusals, generated ----------------------------------------------------------------------------

names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=14).filter(lambda k: k not in FIELDS)
wrong_types = st.sampled_from(
    [
        ("learning_rate", "0.001"),
        ("learning_rate", [1]),
        ("hidden", 3),
        ("hidden", ["8"]),
        ("eps", None),
        ("schedule", "linear"),
    ]
)


@st.composite
def bad_configs(draw):
    """A config that fits TrainConfig except one thing: a key it lacks, a wrong type, or a missing required key."""
    good = {
        "learning_rate": draw(st.floats(1e-6, 1.0)),
        "hidden": draw(st.lists(st.integers(1, 64), min_size=1, max_size=3)),
    }
    kind = draw(st.sampled_from(["unknown", "type", "missing"]))
    if kind == "unknown":
        key = draw(names)
        return {**good, key: draw(st.integers() | st.text(max_size=4))}, key
    if kind == "type":
        key, value = draw(wrong_types)
        return {**good, key: value}, key
    del good["learning_rate"]
    return good, "learning_rate"


def _one_line(text: str, key: str) -> None:
    assert f"train_config.{key}" in text and "\n" not in text, text


@settings(max_examples=60, deadline=None)
@given(case=bad_configs())
def test_the_cli_refuses_it(case):
    cfg, key = case
    with pytest.raises(InputError) as exc:
        build(
            TrainModelConfig,
            {"data": "d", "output_dir": "o", "train_function": TYPED, "train_config": cfg},
            "train_model",
        )
    _one_line(str(exc.value), key)


@settings(max_examples=40, deadline=None)
@given(case=bad_configs())
def test_a_dags_operator_refuses_it_at_import(case):
    from trainpipe.components.train_model.airflow_task import TrainModelOperator

    cfg, key = case
    with pytest.raises(TypeError) as exc:
        TrainModelOperator(
            task_id="t",
            settings={"data": "/d", "output_dir": "/o/{{ run_id }}", "train_function": TYPED, "train_config": cfg},
        )
    _one_line(str(exc.value), key)


def test_a_dags_operator_checks_what_no_template_hides():
    """A templated value is known when the task renders it: its key is checked now, its value then."""
    from trainpipe.components.train_model.airflow_task import TrainModelOperator

    ok = {"learning_rate": "{{ params.lr }}", "hidden": [8]}
    TrainModelOperator(
        task_id="a", settings={"data": "/d", "output_dir": "/o", "train_function": TYPED, "train_config": ok}
    )
    with pytest.raises(TypeError, match=r"train_config.hiden: unknown key"):
        TrainModelOperator(
            task_id="b",
            settings={"data": "/d", "output_dir": "/o", "train_function": TYPED, "train_config": {**ok, "hiden": [8]}},
        )
    # a built-in's config, the same way
    with pytest.raises(TypeError, match=r"train_config.hiden_units'?: unknown key"):
        TrainModelOperator(
            task_id="c", settings={"data": "/d", "output_dir": "/o", "train_config": {"hiden_units": [8]}}
        )


@settings(max_examples=25, deadline=None)
@given(case=bad_configs())
def test_a_kfp_pipeline_refuses_it_at_compile(case):
    from kfp import dsl

    from trainpipe.components.train_model.kfp_component import train_model

    cfg, key = case
    with pytest.raises(TypeError) as exc:

        @dsl.pipeline(name="team")
        def team(data_uri: str) -> None:
            raw = dsl.importer(artifact_uri=data_uri, artifact_class=dsl.Dataset)
            train_model(data=raw.output, train_function=TYPED, train_config=cfg)

    _one_line(str(exc.value), key)


def test_a_kfp_pipeline_passes_a_dict_with_a_parameter_in_it(tmp_path):
    """A dict holding a pipeline parameter compiles; a misspelled key beside the parameter is still refused."""
    from kfp import compiler, dsl

    from trainpipe.components.train_model.kfp_component import train_model

    @dsl.pipeline(name="team")
    def team(data_uri: str, lr: float = 1e-05) -> None:
        raw = dsl.importer(artifact_uri=data_uri, artifact_class=dsl.Dataset)
        train_model(data=raw.output, train_function=TYPED, train_config={"hidden": [32, 16], "learning_rate": lr})

    compiler.Compiler().compile(team, str(tmp_path / "p.yaml"))
    assert "$kfp_parameter" in (tmp_path / "p.yaml").read_text()

    with pytest.raises(TypeError, match=r"train_config.hiden: unknown key"):

        @dsl.pipeline(name="team2")
        def team2(data_uri: str, lr: float = 1e-05) -> None:
            raw = dsl.importer(artifact_uri=data_uri, artifact_class=dsl.Dataset)
            train_model(data=raw.output, train_function=TYPED, train_config={"hiden": [32], "learning_rate": lr})


#: A pipeline parameter of each type KFP carries, and the TrainConfig fields its type fits (strictly, as the step
#: reads it: an int fills a float field, a str the Literal schedule; a float, a str or a bool fills no other).
PARAMETER_FITS = {str: {"schedule"}, int: {"learning_rate", "eps"}, float: {"learning_rate", "eps"}, bool: set()}


@settings(max_examples=30, deadline=None)
@given(kind=st.sampled_from([str, int, float, bool]), key=st.sampled_from(sorted(FIELDS)) | names)
def test_a_kfp_pipeline_refuses_a_parameter_under_a_key_or_of_a_type_the_config_does_not_take(kind, key):
    """A pipeline parameter inside ``train_config`` is known by its name and its type at compile time: under a
    key the typed config lacks, or of a type its field does not take (a str parameter for learning_rate),
    the compile is refused in one line naming the key; a fitting one compiles."""
    from kfp import dsl

    from trainpipe.components.train_model.kfp_component import train_model

    fits = key in PARAMETER_FITS[kind]
    base = {"learning_rate": 0.01} if key != "learning_rate" else {}

    def build() -> None:
        @dsl.pipeline(name="team")
        def team(data_uri: str, p: kind) -> None:  # type: ignore[valid-type]
            raw = dsl.importer(artifact_uri=data_uri, artifact_class=dsl.Dataset)
            train_model(data=raw.output, train_function=TYPED, train_config={**base, key: p})

    if fits:
        build()
        return
    with pytest.raises(TypeError) as exc:
        build()
    _one_line(str(exc.value), key)
    assert ("unknown key" in str(exc.value)) == (key not in FIELDS)


@settings(max_examples=40, deadline=None)
@given(key=names)
def test_a_study_refuses_a_key_the_config_lacks_before_its_first_trial(key):
    from trainpipe.components.tune_model.spec import TuneModelParams

    space = {f"train_config.{key}": {"type": "float", "low": 0.1, "high": 0.2}}
    with pytest.raises(InputError) as exc:
        build(TuneModelParams, {"space": space, "train": {"train_function": TYPED}}, "tune_model")
    assert f"'train_config.{key}' is not a key of {TYPED}'s config TrainConfig" in str(exc.value)


@settings(max_examples=30, deadline=None)
@given(
    case=st.sampled_from(
        [("hidden", [[8], ["x"]]), ("schedule", ["constant", "linear"]), ("learning_rate", ["a", 0.1])]
    )
)
def test_a_study_refuses_a_choice_of_the_wrong_type(case):
    from trainpipe.components.tune_model.spec import TuneModelParams

    key, choices = case
    space = {f"train_config.{key}": {"type": "categorical", "choices": choices}}
    train = {"train_function": TYPED, "train_config": {"learning_rate": 0.1}}
    with pytest.raises(InputError, match=rf"space.train_config.{key}'?: .* does not fit"):
        build(TuneModelParams, {"space": space, "train": train}, "tune_model")


# --- a pipeline config's tune section searches the function its train section names ------------------------

PIPELINE_TRAIN = {"train_function": TYPED, "train_config": {"learning_rate": 0.1, "hidden": [8]}, "epochs": 1}


@settings(max_examples=40, deadline=None)
@given(key=names, repeated=st.booleans())
def test_a_pipeline_configs_tune_space_is_checked_against_its_train_sections_function(key, repeated):
    """Issue 44: the space was checked against builtin:mlp, whatever train.train_function said, unless tune.train
    repeated it. Now a key of the team's config is searched, one it lacks refused, the train section repeated
    in tune.train or not."""
    from trainpipe.pipelines.config import PipelineConfig

    def config(space_key: str) -> dict:
        space = {f"train_config.{space_key}": {"type": "float", "low": 1e-08, "high": 1e-06}}
        tune = {"space": space, **({"train": PIPELINE_TRAIN} if repeated else {})}
        tune["objectives"] = [{"metric": "val_loss", "direction": "minimize"}]  # what teampkg.typed logs
        return {"data": "raw.csv", "train": PIPELINE_TRAIN, "tune": tune}

    accepted = build(PipelineConfig, config("eps"), "pipeline config")  # TrainConfig's, not builtin:mlp's
    assert accepted.tune_settings()["train"]["train_function"] == TYPED
    assert accepted.tune_settings()["trusted_packages"] == ["teampkg"]  # once, repeated or not
    with pytest.raises(InputError) as exc:
        build(PipelineConfig, config(key), "pipeline config")
    assert f"'tune.space': 'train_config.{key}' is not a key of {TYPED}'s config TrainConfig" in str(exc.value)


def test_a_training_on_tuned_settings_takes_its_typed_config_from_them(tmp_path):
    """Issue 44: ``--tuned DIR`` without ``--train-config``: the flags' config was checked before the best
    trial's settings were laid over it, so every required key was missing. The entrypoint lays them first."""
    import json

    from trainpipe.components.train_model.spec import NAME
    from trainpipe.contract import artifacts
    from trainpipe.contract.entrypoint import run

    tuned = tmp_path / "tune"
    best = {"train_function": TYPED, "train_config": {"schedule": "cosine", "learning_rate": 0.01, "hidden": [16]}}
    tuned.mkdir()
    (tuned / "best_settings.json").write_text(json.dumps(best))
    artifacts.finish_output(str(tuned), "tune_model", {}, {})
    (tmp_path / "d.csv").write_text("a,label\n1,0\n")
    given = []

    def core(config, lineage, runtime):  # train_model's core would train here: what reaches it is the point
        given.append(config)
        raise InputError("stop")

    argv = ["--data", str(tmp_path / "d.csv"), "--output-dir", str(tmp_path / "m"), "--tuned", str(tuned)]
    assert run(NAME, TrainModelConfig, core, [*argv, "--train-function", TYPED]) == 2
    assert [c.train_config for c in given] == [best["train_config"]]
    assert list(given[0].train_config) == ["schedule", "learning_rate", "hidden"]  # in the study's own order
    (tuned / "best_settings.json").write_text("{}")
    assert run(NAME, TrainModelConfig, core, argv) == 2 and len(given) == 1  # no settings: refused before the core
