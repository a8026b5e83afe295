"""What a run used and what it cost: the arithmetic, the prices a profile declares, and their errors."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trainpipe.contract.errors import InputError
from trainpipe.costs import Meter, Prices, Usage
from trainpipe.profiles import get_profile, prices_of

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
