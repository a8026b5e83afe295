"""optimize_model's parts on tiny models: pruning and its refusals, the exporter's refusal naming the
operator, the chart, and the choice among accepted variants."""

from __future__ import annotations

import pytest

from trainpipe.contract.errors import InputError

pytestmark = pytest.mark.unit


def _mlp(hidden: list[int]):
    from trainpipe.services.serving.nets import mlp

    return mlp(8, 3, hidden)


def test_pruning_spares_the_last_layer_and_reaches_the_sparsity():
    import torch

    from trainpipe.components.optimize_model.variants import prunable, prune, zero_share

    torch.manual_seed(0)
    net = _mlp([16, 16])
    assert [n for n, _ in prunable(net)] == ["body.0", "body.2"]  # the head keeps every output
    params = prune(net, 0.75, "unstructured")
    assert zero_share(params) == pytest.approx(0.75, abs=0.01) and int((net.head.weight == 0).sum()) == 0
    net = _mlp([16])
    prune(net, 0.5, "structured")
    rows_zero = (net.body[0].weight == 0).all(dim=1)
    assert int(rows_zero.sum()) == 8  # whole units


def test_an_impossible_sparsity_and_a_model_without_layers_to_prune_are_refused():
    import torch

    from trainpipe.components.optimize_model.variants import prune

    with pytest.raises(
        InputError, match=r"^sparsity: 0.97 structured removes all 16 units of layer body.0; at most 0.938 keeps one$"
    ):
        prune(_mlp([16]), 0.97, "structured")
    with pytest.raises(InputError, match=r"^variants: pruned needs a Linear or Conv layer besides the last one"):
        prune(torch.nn.Sequential(torch.nn.Linear(4, 2)), 0.5, "unstructured")


def test_export_names_the_operator_onnx_cannot_translate(tmp_path):
    import numpy as np
    import torch

    from trainpipe.components.optimize_model.variants import _unexportable_op, export_onnx

    class Kth(torch.nn.Module):
        def forward(self, x):
            return torch.kthvalue(x, 2, dim=1).values[:, None]

    with pytest.raises(
        InputError, match=r"^model: ONNX cannot export it: no ONNX translation for the operator aten.kthvalue "
    ):
        export_onnx(Kth(), np.zeros((2, 4), dtype=np.float32), tmp_path / "k.onnx")
    assert not (tmp_path / "k.onnx").exists()
    assert (
        _unexportable_op("Exporting the operator 'aten::kthvalue' to ONNX opset version 18 is not supported")
        == "aten.kthvalue"
    )
    assert export_onnx(_mlp([4]).eval(), np.zeros((2, 8), dtype=np.float32), tmp_path / "m.onnx") == "dynamo"


def _variant(name: str, metric: float, p50: float, rps: float, size: int, accepted: bool):
    from trainpipe.components.optimize_model.spec import Variant

    return Variant(
        name=name,
        metric=metric,
        metric_drop=0.9 - metric,
        metrics={"accuracy": metric},
        size_bytes=size,
        size_ratio=1.0,
        compressed_bytes=size,
        latency_p50_ms=p50,
        latency_p99_ms=p50 * 2,
        throughput_rows_s=rps,
        speedup_b1=1.0,
        speedup_b256=1.0,
        accepted=accepted,
        reason="",
    )


def test_the_choice_is_among_accepted_variants_only_and_the_chart_draws_each():
    from trainpipe.components.optimize_model.choice import _select, chart, report
    from trainpipe.components.optimize_model.spec import OptimizeModelResult

    vs = [
        _variant("fp32", 0.9, 1.0, 100.0, 400, False),
        _variant("onnx", 0.9, 0.5, 200.0, 500, True),
        _variant("int8_dynamic", 0.85, 0.2, 900.0, 100, False),
        _variant("int8_static", 0.899, 0.3, 400.0, 120, True),
    ]
    assert _select(vs, "throughput").name == "int8_static" and _select(vs, "latency").name == "int8_static"
    assert _select(vs, "size").name == "int8_static" and _select(vs[:1] + vs[2:3], "throughput") is None
    result = OptimizeModelResult(
        task="classification",
        metric="accuracy",
        max_metric_drop=0.005,
        n_test=10,
        calibration_rows=5,
        threads=1,
        cpu="cpu",
        onnxruntime="1",
        variants=vs,
        selected="int8_static",
        reason="r",
    )
    svg = chart(result)
    assert svg.count('class="point"') == 4 and 'data-variant="int8_dynamic"' in svg and "#c33" in svg  # rejected: red
    page = report(result)
    assert page.count("<tr data-variant=") == 4 and "selected int8_static" in page
    # what the Pushgateway gets: per variant, labelled by it
    series = {(name, labels["variant"]): value for name, _, labels, value in result.series()}
    assert series[("trainpipe_optimize_throughput_rows_per_second", "int8_static")] == 400.0
    assert (
        series[("trainpipe_optimize_accepted", "int8_dynamic")] == 0.0
        and series[("trainpipe_optimize_latency_p50_seconds", "onnx")] == 0.0005
    )
    assert result.summary().startswith("int8_static: accuracy 0.8990")
