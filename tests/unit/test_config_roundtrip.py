"""A team's ``train_config`` reaches its function as written, on every face: same values, same Python
types, same key order. Generated, not listed: nested JSON values with integers past 2**53, floats over
the whole range written with and without exponents (``1e-05``, a usual learning rate, once arrived as
the string ``'1e-05'``), booleans, null, unicode keys, empty lists and objects, keys in any order. Each
goes through a face's own serialization and the entrypoint's own parsing."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainpipe.components.train_model.spec import NAME, TrainModelConfig
from trainpipe.contract.config import build, dump_yaml, parse_yaml
from trainpipe.contract.entrypoint import make_parser, parse_settings, read_settings
from trainpipe.faces import surface
from trainpipe.faces.command import component_command

pytestmark = pytest.mark.unit

#: A team function that is not installed here: its config is untyped, so only the carrying is tested.
UNTYPED = "absent_team_pkg.train:fit"

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from([1e-05, 1e-08, 1e16, 1e300, 5e-324, -0.0, 0.1, 3.0])
    | st.text(max_size=12)
)
keys = st.text(min_size=1, max_size=8).filter(lambda k: k != surface.SLOT)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=4),
    max_leaves=16,
)
configs = st.dictionaries(keys, json_values, max_size=6)


def same(a: Any, b: Any) -> bool:
    """Equal in value, Python type and key order, all the way down."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float):
        return a == b and math.copysign(1, a) == math.copysign(1, b)
    return a == b


def base(tmp: Path) -> dict[str, Any]:
    return {"data": str(tmp / "d.csv"), "output_dir": str(tmp / "out"), "train_function": UNTYPED}


def entrypoint(argv: list[str]) -> dict[str, Any]:
    """What ``python -m trainpipe.components.train_model <argv>`` reads from its command line."""
    ns = vars(make_parser(NAME, TrainModelConfig, "").parse_args(argv))
    return build(TrainModelConfig, read_settings(TrainModelConfig, ns, NAME), where=NAME).train_config


def by_flags(cfg: dict, tmp: Path) -> dict:
    """By hand, and every face's command line (KFP's body, the Airflow operator, the pod): --train-config JSON."""
    cmd = component_command(NAME, {**base(tmp), "train_config": cfg}, orchestrator="manual")
    return entrypoint(cmd[cmd.index("--orchestrator") :])


def by_json_file(cfg: dict, tmp: Path) -> dict:
    import json

    path = tmp / "c.json"
    path.write_text(json.dumps({**base(tmp), "train_config": cfg}), encoding="utf-8")
    return entrypoint(["--config", str(path)])


def by_yaml_file(cfg: dict, tmp: Path) -> dict:
    path = tmp / "c.yaml"
    path.write_text(dump_yaml({**base(tmp), "train_config": cfg}), encoding="utf-8")
    assert same(parse_yaml(path.read_text(encoding="utf-8"))["train_config"], cfg)
    return entrypoint(["--config", str(path)])


def by_kfp_parameter(cfg: dict, tmp: Path) -> dict:
    """The reference pipeline: the config's train_config as a pipeline parameter's default (JSON text)."""
    (param,) = surface.kfp_params(TrainModelConfig, ["train_config"])
    carried = surface.kfp_value(cfg, param)
    settings = surface.from_kfp({"train_config": carried}, TrainModelConfig)
    return by_flags_text(settings["train_config"], tmp)


def by_kfp_dict(cfg: dict, tmp: Path) -> dict:
    """A team's own pipeline passes a dict to the face (its JSON text written at compile time)."""
    carried, late = surface.to_kfp_text(cfg, "train_config")
    assert not late
    return by_flags_text(surface.from_kfp({"train_config": carried}, TrainModelConfig)["train_config"], tmp)


def by_flags_text(text: str, tmp: Path) -> dict:
    cmd = component_command(NAME, {**base(tmp), "train_config": text}, orchestrator="kfp")
    return entrypoint(cmd[cmd.index("--orchestrator") :])


def by_rendered_template(cfg: dict, tmp: Path) -> dict:
    """An Airflow settings value rendered to text (``{{ ... | tojson }}`` or an XCom), read as the step reads it."""
    import json

    return parse_settings(TrainModelConfig, {**base(tmp), "train_config": json.dumps(cfg)}, NAME).train_config


def by_dag_param(cfg: dict, tmp: Path, conf: bool = True) -> dict:
    """The reference DAG's train_model: its ``train_config`` setting is the template of the ``train`` param
    (:func:`~trainpipe.pipelines.dag_settings._param`), rendered by the operator as a task renders it, from the
    run's param (``conf``) or, where a run's conf leaves it out, from the config's value compiled into the
    template; read as the step reads it."""
    from trainpipe.components.train_model.airflow_task import TrainModelOperator
    from trainpipe.pipelines.dag_settings import _param

    template = _param("train.train_config", cfg, nested=True)
    op = TrainModelOperator(task_id="train_model", settings={**base(tmp), "train_config": template})
    rendered = op.render_template(template, {"params": {"train": {"train_config": cfg} if conf else {}}})
    return parse_settings(TrainModelConfig, {**base(tmp), "train_config": rendered}, NAME).train_config


def by_dag_param_default(cfg: dict, tmp: Path) -> dict:
    """:func:`by_dag_param` where the run's conf replaced ``train`` without a train_config: the config's own."""
    return by_dag_param(cfg, tmp, conf=False)


def by_rank_file(cfg: dict, tmp: Path) -> dict:
    """train_model's launcher writes the ranks' settings; each rank reads them."""
    from trainpipe.contract.io import atomic_write_settings
    from trainpipe.training.worker import read_settings as rank_reads

    config = build(TrainModelConfig, {**base(tmp), "train_config": cfg})
    atomic_write_settings(tmp / "rank.json", config)
    return rank_reads(tmp / "rank.json").train_config


def by_kubernetes_job(cfg: dict, tmp: Path) -> dict:
    """A TrainJob's or PyTorchJob's nodes read the train.json the step stages on the shared volume."""
    from trainpipe.components.train_model import k8s

    (tmp / "d.csv").write_text("a,label\n1,0\n", encoding="utf-8")
    cluster = {"shared_pvc": "pvc", "mount_path": str(tmp / "pvc"), "profile": "cpu"}
    config = build(TrainModelConfig, {**base(tmp), "train_config": cfg, "cluster": cluster})
    workdir, _ = k8s.stage(config, "job")
    return entrypoint(["--config", str(workdir / "train.json")])


def by_slurm_job(cfg: dict, tmp: Path) -> dict:
    """Each Slurm node runs the entrypoint on the train.json the step writes before sbatch."""
    from trainpipe.components.train_model import slurm_job

    (tmp / "d.csv").write_text("a,label\n1,0\n", encoding="utf-8")
    config = build(TrainModelConfig, {**base(tmp), "train_config": cfg, "slurm": {}})
    path = slurm_job.stage(config, tmp / "slurm")
    return entrypoint(["--config", str(path)])


def by_tune_trial(cfg: dict, tmp: Path) -> dict:
    """A study's trial: the train section's train_config, one key sampled into it, as its command reads it."""
    from trainpipe.components.tune_model.spec import TuneModelConfig
    from trainpipe.components.tune_model.trial import TrialRun, trial_settings
    from trainpipe.contract.lineage import Lineage

    tune = build(
        TuneModelConfig,
        {
            "data": str(tmp / "d.csv"),
            "output_dir": str(tmp / "t"),
            "space": {"train_config.sampled": {"type": "categorical", "choices": [1, 2]}},
            "train": {"train_function": UNTYPED, "train_config": cfg},
            "study_name": "s",
        },
    )
    settings = trial_settings(tune, {"train_config.sampled": 2})
    out = tmp / "t" / "trials" / "trial-0000"
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = TrialRun(tune, tmp / "rows.parquet", "", Lineage(), None).command(SimpleNamespace(number=0), settings, out)
    got = entrypoint(cmd[cmd.index("--config") :])
    assert got.pop("sampled") == 2
    return got


def by_tuned(cfg: dict, tmp: Path) -> dict:
    """A training on a study's best trial (``--tuned``): tune_model writes the trial's settings to its output
    (best_settings.json) and train_model's entrypoint lays them over its own flags."""
    from unittest import mock

    import optuna

    from trainpipe.components.tune_model import summary as tune_summary
    from trainpipe.components.tune_model.spec import TuneModelConfig
    from trainpipe.contract.entrypoint import lay_settings
    from trainpipe.contract.lineage import Lineage

    out = tmp / "tune"
    space = {"train_config.sampled": {"type": "categorical", "choices": [1, 2]}}
    tune = build(
        TuneModelConfig,
        {"data": str(tmp / "d.csv"), "output_dir": str(out), "space": space, "train": {"train_function": UNTYPED}},
    ).model_copy(update={"study_name": "s"})
    settings = {"train_function": UNTYPED, "train_config": cfg}
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study()
    study.add_trial(optuna.trial.create_trial(value=0.5, user_attrs={"settings": settings, "params": {}}))
    out.mkdir(parents=True, exist_ok=True)
    with mock.patch("trainpipe.components.tune_model.report.write_report", return_value=""):  # no figures here
        tune_summary.summarize(study, tune, 1, "", Lineage(), out, write=True)
    paths = {"data": str(tmp / "d.csv"), "output_dir": str(tmp / "m"), "tuned": str(out)}
    cmd = component_command(NAME, paths, orchestrator="manual")
    ns = vars(make_parser(NAME, TrainModelConfig, "").parse_args(cmd[cmd.index("--orchestrator") :]))
    read = lay_settings(TrainModelConfig, read_settings(TrainModelConfig, ns, NAME))  # as the entrypoint reads them
    return build(TrainModelConfig, read, where=NAME).train_config


PATHS = [
    by_flags,
    by_json_file,
    by_yaml_file,
    by_kfp_parameter,
    by_kfp_dict,
    by_rendered_template,
    by_dag_param,
    by_dag_param_default,
    by_rank_file,
    by_kubernetes_job,
    by_slurm_job,
    by_tune_trial,
    by_tuned,
]


@pytest.mark.parametrize("path", PATHS, ids=[p.__name__ for p in PATHS])
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cfg=configs)
def test_train_config_arrives_as_written(path, cfg, tmp_path):
    if path is by_tune_trial:
        cfg = {k: v for k, v in cfg.items() if k != "sampled"}
    got = path(cfg, tmp_path)
    assert same(got, cfg), f"{path.__name__}: {cfg!r} arrived as {got!r}"


@pytest.mark.parametrize("path", PATHS, ids=[p.__name__ for p in PATHS])
def test_a_learning_rate_with_an_exponent_is_a_float_on_every_face(path, tmp_path):
    cfg = {"learning_rate": 1e-05, "eps": 1e-08, "big": 1e16, "opt": {"z": 1, "a": 2**60}}
    got = path(cfg, tmp_path)
    assert same(got, cfg), f"{path.__name__}: {got!r}"


def test_a_yaml_config_reads_numbers_as_json_does():
    """YAML 1.2's core schema (a pipeline config, a --config file): what JSON would read the same, and the
    YAML 1.1 surprises (octal, sexagesimal, yes/no, dates) stay what they look like."""
    doc = parse_yaml("lr: 1e-05\nbig: 1e+16\nten: 010\nword: yes\nday: 2026-01-01\ntime: 1:20\nhex: 0x1F\n")
    assert same(
        doc, {"lr": 1e-05, "big": 1e16, "ten": 10, "word": "yes", "day": "2026-01-01", "time": "1:20", "hex": 31}
    )


def test_a_structured_flag_that_is_not_json_is_one_line(tmp_path):
    from trainpipe.contract.errors import InputError

    with pytest.raises(InputError) as exc:
        entrypoint(["--data", "d", "--output-dir", "o", "--train-config", "{eps: 1e-8}"])
    assert str(exc.value).startswith("train_model field 'train_config': not JSON") and "\n" not in str(exc.value)


def test_kfp_carries_a_pipeline_parameter_inside_the_config_as_its_type():
    """A team's pipeline: ``train_config={"hidden_units": [32, 16], "learning_rate": lr}``. KFP writes each
    parameter's value as text in its slot when the task runs; the face reads it back as its type."""
    import json

    class Channel:
        def __init__(self, name: str, kind: str) -> None:
            self.name, self.channel_type, self.pattern = name, kind, f"{{{{channel:task=;name={name};type={kind};}}}}"

        def __str__(self) -> str:
            return self.pattern

    lr, n, flag, tag = (
        Channel("lr", "Float"),
        Channel("n", "Integer"),
        Channel("flag", "Boolean"),
        Channel("t", "String"),
    )
    text, late = surface.to_kfp_text(
        {"hidden_units": [32, 16], "learning_rate": lr, "x": {"n": n, "f": flag, "t": tag}}, "c"
    )
    assert late == {"learning_rate", "x"}
    # what KFP (kfp.local, the backend's driver) puts in each placeholder's place
    for ch, value in ((lr, "1e-05"), (n, "3"), (flag, "false"), (tag, "blue")):
        text = text.replace(ch.pattern, value)
    got = json.loads(surface.from_kfp_text(text))
    assert same(got, {"hidden_units": [32, 16], "learning_rate": 1e-05, "x": {"n": 3, "f": False, "t": "blue"}})
    with pytest.raises(TypeError, match="pipeline parameter 'd' is a Dict"):
        surface.to_kfp_text({"d": Channel("d", "Dict")}, "train_config")


def test_a_flag_is_taken_only_as_spelt(capsys):
    """A new user's ``--epoch 2`` trained as ``--epochs 2``: argparse takes an unambiguous prefix. A step's
    flags are its settings' names, and a misspelt one is refused as unknown."""
    with pytest.raises(SystemExit) as exc:
        make_parser(NAME, TrainModelConfig, "").parse_args(["--epoch", "2"])
    assert exc.value.code == 2 and "unrecognized arguments: --epoch 2" in capsys.readouterr().err
