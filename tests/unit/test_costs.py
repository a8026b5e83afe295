"""What a run used and what it cost: the arithmetic, the prices a profile declares, and their errors."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trainpipe.contract.errors import InputError
from trainpipe.services.costs import Meter, Prices, Usage
from trainpipe.services.profiles import get_profile, prices_of

pytestmark = pytest.mark.unit

seconds = st.floats(0, 1e7, allow_nan=False)
price = st.floats(0, 1e3, allow_nan=False)


@given(wall=seconds, gpu=seconds, cpu=seconds, nodes=st.integers(1, 64), g=price, c=price, n=price)
def test_cost_is_each_resource_at_its_price(wall, gpu, cpu, nodes, g, c, n):
    usage = Usage(wall_seconds=wall, gpu_seconds=gpu, cpu_core_seconds=cpu, peak_memory_mb=1, nodes=nodes)
    prices = Prices(currency="USD", gpu_hour=g, cpu_core_hour=c, node_hour=n)
    expected = gpu / 3600 * g + cpu / 3600 * c + wall * nodes / 3600 * n
    assert usage.cost(prices) == pytest.approx(expected, rel=1e-9, abs=1e-6)
    assert usage.cost(Prices()) == 0.0  # an unpriced resource costs nothing
    assert usage.figures(prices)["cost"] == usage.cost(prices) and "cost" not in usage.figures(None)


def test_an_hour_of_one_gpu_costs_its_gpu_hour():
    usage = Usage(wall_seconds=3600, gpu_seconds=3600, cpu_core_seconds=0, peak_memory_mb=0)
    assert usage.cost(Prices(gpu_hour=2.5)) == 2.5


def test_the_meter_counts_the_cpu_time_of_the_processes_it_waited_for():
    import subprocess
    import sys

    meter = Meter()
    subprocess.run([sys.executable, "-c", "sum(i * i for i in range(3_000_000))"], check=True)
    usage = meter.usage(gpus=2)
    assert usage.cpu_core_seconds > 0.05 and usage.peak_memory_mb > 1
    assert usage.gpu_seconds == round(2 * usage.wall_seconds, 3)


def test_the_meter_counts_its_own_process_too():
    """The step's own CPU (its start-up, the MLflow run, logging the model) is the step's: a third of a small
    training's CPU-seconds was left out. Its own from the process's start with ``whole_process``."""
    meter = Meter()
    sum(i * i for i in range(3_000_000))  # this process's work, no child
    assert meter.usage().cpu_core_seconds > 0.05
    import resource

    own = resource.getrusage(resource.RUSAGE_SELF)
    assert Meter(whole_process=True).usage().cpu_core_seconds >= round(own.ru_utime + own.ru_stime, 3)


def test_a_profile_declares_prices_and_a_bad_price_is_one_line(tmp_path):
    good = tmp_path / "p.yaml"
    good.write_text("name: team-a100\nprices: {currency: EUR, gpu_hour: 3.1, node_hour: 0.4}\n")
    assert get_profile(str(good)).prices == Prices(currency="EUR", gpu_hour=3.1, node_hour=0.4)
    assert prices_of(str(good)).gpu_hour == 3.1
    assert prices_of("local") is None and prices_of("cpu") is None  # no profile, an unpriced one
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nprices: {currency: euro, gpu_hour: -1}\n")
    with pytest.raises(InputError, match=r"prices\.currency") as exc:
        get_profile(str(bad))
    assert "\n" not in str(exc.value)
    assert prices_of(str(bad)) is None  # reporting a cost never fails a run


def test_a_budget_names_the_limit_it_reached_and_what_was_spent():
    from trainpipe.services.costs import Budget

    spent = Usage(wall_seconds=7200, gpu_seconds=14_400, cpu_core_seconds=3600, peak_memory_mb=1)
    prices = Prices(currency="EUR", gpu_hour=2.0)
    assert Budget(9.0, None, prices).reached(spent) is None  # 4 GPU-hours at 2 EUR: 8 EUR
    said = Budget(8.0, None, prices).reached(spent)
    assert said == (
        "max_cost: spent 8.0000 EUR of 8 EUR (14400 GPU-seconds, 3600 CPU-core-seconds, 7200 s over every attempt)"
    )
    assert Budget(None, 4.5, None).reached(spent) is None
    assert Budget(None, 4.0, None).reached(spent).startswith("max_gpu_hours: spent 4.0000 GPU-hours of 4 ")


def test_what_every_attempt_spent_is_kept_beside_the_checkpoints(tmp_path):
    from trainpipe.services.costs import record_spent, spent_before

    assert spent_before(tmp_path / "none") is None
    first = Usage(wall_seconds=1.5, gpu_seconds=3, cpu_core_seconds=2, peak_memory_mb=100)
    record_spent(tmp_path / "ckpt", first)
    second = Usage(wall_seconds=2, gpu_seconds=4, cpu_core_seconds=1, peak_memory_mb=80) + spent_before(
        tmp_path / "ckpt"
    )
    assert second == Usage(wall_seconds=3.5, gpu_seconds=7, cpu_core_seconds=3, peak_memory_mb=100)
    (tmp_path / "ckpt" / "spent.json").write_text("not json")
    assert spent_before(tmp_path / "ckpt") is None  # a damaged record counts as none, never fails a run


def test_max_cost_on_an_unpriced_profile_is_one_line(tmp_path):
    from trainpipe.components.train_model.core import spending_of
    from trainpipe.components.train_model.spec import TrainModelConfig

    config = TrainModelConfig(data=str(tmp_path), output_dir=str(tmp_path / "out"), max_cost=10)
    with pytest.raises(InputError, match=r"^max_cost: the hardware profile 'cpu' declares no prices"):
        spending_of(config, "cpu")
    assert spending_of(config.model_copy(update={"max_cost": None, "max_gpu_hours": 1.0}), "cpu").budget is not None


prices = st.builds(
    Prices,
    currency=st.sampled_from(["EUR", "USD", "AED"]),
    gpu_hour=price,
    cpu_core_hour=price,
    node_hour=price,
)


@given(prices=prices, port=st.integers(0, 65_535))
def test_a_profile_file_travels_to_a_step_as_its_content_without_its_secrets(prices, port):
    """A profile file lies on the machine that compiled the pipeline or parsed the DAG, not in the step's pod:
    TRAINPIPE_HARDWARE_PROFILE carries its content (what the KFP pipeline and the DAGs set), and the step
    reads its prices, port and name from it; the names of the secrets it mounts stay out."""
    from trainpipe.services.profiles import HardwareProfile, metrics_port, profile_name, to_env

    team = HardwareProfile(
        name="team-a100",
        prices=prices,
        metrics_port=port,
        secrets_as_env={"mlflow-creds": {"password": "MLFLOW_TRACKING_PASSWORD"}},
        image_pull_secrets=["regcred"],
    )
    carried = to_env(team)
    assert "MLFLOW_TRACKING_PASSWORD" not in carried and "regcred" not in carried
    assert get_profile(carried) == team.model_copy(update={"secrets_as_env": {}, "image_pull_secrets": []})
    assert prices_of(carried) == prices and metrics_port(carried) == port and profile_name(carried) == "team-a100"


def test_a_built_in_profile_travels_by_its_name():
    from trainpipe.services.profiles import PROFILES, profile_name, to_env

    assert [to_env(p) for p in PROFILES.values()] == list(PROFILES)
    assert profile_name("local") == "local" and prices_of("{not json") is None  # no profile, or none readable


def _pipeline_config(tmp_path, profile: str | None, **sections) -> str:
    """A pipeline config in a folder of its own (its profile file beside it), read from another folder."""
    import yaml

    folder = tmp_path / "team"
    folder.mkdir(exist_ok=True)
    (folder / "priced.yaml").write_text("name: team-cpu-priced\nprices: {currency: EUR, cpu_core_hour: 0.05}\n")
    (folder / "unpriced.yaml").write_text("name: team-cpu\n")
    config = {"data": "raw.csv", **({"profile": profile} if profile else {}), **sections}
    (folder / "pipeline.yaml").write_text(yaml.safe_dump(config))
    return str(folder / "pipeline.yaml")


SPACE = {"train_config.learning_rate": {"type": "float", "low": 0.01, "high": 0.1}}
COSTLY = {
    "train.max_cost": {"train": {"max_cost": 5}},
    "tune.max_cost": {"tune": {"space": SPACE, "max_cost": 40}},
    "tune.objectives": {"tune": {"space": SPACE, "objectives": [{"metric": "accuracy"}, {"metric": "cost"}]}},
    "tune.train.max_cost": {"tune": {"space": SPACE, "train": {"max_cost": 5}}},
}


@pytest.mark.parametrize("field", COSTLY)
@pytest.mark.parametrize("profile", [None, "unpriced.yaml"])
def test_a_cost_setting_on_a_profile_without_prices_is_refused_when_the_config_is_read(
    tmp_path, monkeypatch, field, profile
):
    from trainpipe.pipelines.config import load_pipeline_config

    monkeypatch.chdir(tmp_path)  # the profile file is found beside the config, not in the working folder
    with pytest.raises(InputError) as exc:
        load_pipeline_config(_pipeline_config(tmp_path, profile, **COSTLY[field]))
    said = str(exc.value)
    assert said.startswith(f"pipeline config field {field!r}: the hardware profile ") and "declares no prices" in said
    assert "\n" not in said


@pytest.mark.parametrize("field", COSTLY)
def test_a_cost_setting_on_a_priced_profile_file_beside_the_config_is_accepted(tmp_path, monkeypatch, field):
    from trainpipe.pipelines.config import load_pipeline_config

    monkeypatch.chdir(tmp_path)
    config = load_pipeline_config(_pipeline_config(tmp_path, "priced.yaml", **COSTLY[field]))
    assert config.profile == str(tmp_path / "team" / "priced.yaml")
    assert get_profile(config.profile).prices.currency == "EUR"
