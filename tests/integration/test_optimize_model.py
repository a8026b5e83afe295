"""optimize_model on digits with the real exporters and ONNX Runtime: every variant measured on the
held-out rows against fp32 torch, the gate on the metric drop, a structured prune rescued by its
fine-tune, the report in headless Chromium; register_model registers the accepted variant beside the
fp32 version on a real MLflow server and it loads as a pyfunc; a model ONNX cannot export, an
impossible sparsity and an empty calibration set are one line with exit 2 and register nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, make_snapshot, result_of, run_component
from trainpipe.contract.artifacts import MARKER, finish_output

pytestmark = pytest.mark.integration

NAME = "opt-digits"
TEAM = {"PYTHONPATH": str(REPO / "tests" / "fixtures"), "TRAINPIPE_TRUSTED_MODEL_CODE": "teampkg"}


@pytest.fixture(scope="module")
def trained(tmp_path_factory, digits_csv, mlflow_server):
    """digits → validate → snapshot → train (one rank, 8 epochs: about 0.99 accuracy) → evaluate →
    optimize (all four variants)."""
    root = tmp_path_factory.mktemp("optimize")
    snap = make_snapshot(root, digits_csv, "label")
    result_of(
        run_component(
            "train_model",
            "--data",
            str(snap),
            "--output-dir",
            str(root / "m"),
            "--tracking-uri",
            mlflow_server,
            "--nproc-per-node",
            "1",
            "--epochs",
            "8",
            "--checkpoint-every-steps",
            "0",
            "--train-config",
            '{"hidden_units": [64], "learning_rate": 0.05}',
        )
    )
    result_of(
        run_component(
            "evaluate_model",
            "--model",
            str(root / "m"),
            "--data",
            str(snap),
            "--output-dir",
            str(root / "e"),
            "--thresholds",
            '{"accuracy": 0.9}',
            "--model-name",
            NAME,
            "--tracking-uri",
            mlflow_server,
        )
    )
    audit = root / "audit.jsonl"
    import torch

    own = torch.get_num_threads()
    torch.set_num_threads(3)  # this process's own, unlike the step's (--threads 1)
    try:
        result = result_of(
            run_component(
                "optimize_model",
                "--model",
                str(root / "m"),
                "--data",
                str(snap),
                "--output-dir",
                str(root / "o"),
                env={"TRAINPIPE_AUDIT_LOG": str(audit)},
            )
        )
        after = torch.get_num_threads()
    finally:
        torch.set_num_threads(own)
    return {"root": root, "snap": snap, "result": result, "audit": audit, "threads_after": after}


def _variants(result: dict) -> dict[str, dict]:
    return {v["name"]: v for v in result["variants"]}


def test_every_variant_is_measured_against_fp32_on_the_held_out_rows_and_gated_on_the_drop(trained):
    r = trained["result"]
    v = _variants(r)
    assert list(v) == ["fp32", "onnx", "int8_dynamic", "int8_static", "pruned"]
    assert r["metric"] == "accuracy" and r["max_metric_drop"] == 0.005 and r["threads"] == 1 and r["n_test"] == 373
    # measured on one thread, then the process's own again: a step after it in one process (Airflow's dag.test())
    # runs on the threads it would have alone
    assert trained["threads_after"] == 3
    assert r["calibration_rows"] == 512 and r["onnxruntime"] == "1.32.0"
    assert v["fp32"]["metric"] > 0.97
    # the ONNX export matches torch on every held-out row (the check that would have refused it)
    assert v["onnx"]["max_abs_diff"] <= 1e-3 and v["onnx"]["metric"] == v["fp32"]["metric"]
    for name, x in v.items():
        if name == "fp32":
            continue
        assert x["metric_drop"] == pytest.approx(v["fp32"]["metric"] - x["metric"])
        assert x["accepted"] == (x["metric_drop"] <= 0.005), name  # the gate, variant by variant
        assert abs(x["metric_drop"]) <= 0.02, name  # int8 and a half-pruned net stay within two points on digits
        assert x["latency_p50_ms"] > 0 and x["latency_p99_ms"] >= x["latency_p50_ms"] and x["throughput_rows_s"] > 0
        assert x["speedup_b256"] == pytest.approx(x["throughput_rows_s"] / v["fp32"]["throughput_rows_s"])
    # int8 weights: a quarter of the bytes of the weights; the file holds graph and scales too
    assert (
        v["int8_dynamic"]["size_bytes"] < 0.7 * v["onnx"]["size_bytes"]
        and v["int8_static"]["size_bytes"] < 0.7 * v["onnx"]["size_bytes"]
    )
    assert (
        v["pruned"]["sparsity"] == pytest.approx(0.5, abs=0.01)
        and v["pruned"]["compressed_bytes"] < v["onnx"]["compressed_bytes"]
    )
    # the selected one is the fastest accepted variant at batch 256, written with its hash
    accepted = [x for n, x in v.items() if n != "fp32" and x["accepted"]]
    assert r["selected"] == max(accepted, key=lambda x: x["throughput_rows_s"])["name"]
    out = trained["root"] / "o"
    meta = json.loads((out / "model" / "model.json").read_text())
    assert (
        meta["format"] == "trainpipe-onnx/1"
        and meta["variant"] == r["selected"]
        and meta["onnx_sha256"] == r["model_sha256"]
    )
    assert meta["requirements"][0] == "onnxruntime==1.32.0" and not any(
        q.startswith("torch") for q in meta["requirements"]
    )
    assert (
        r["lineage"]["optimization"]["variant"] == r["selected"]
        and r["lineage"]["optimization"]["exporter"] == "dynamo"
    )
    written = json.loads((out / "optimization.json").read_text())
    assert [x["name"] for x in written["variants"]] == list(v)
    events = [json.loads(line) for line in trained["audit"].read_text().splitlines()]
    assert [e["decision"]["selected"] for e in events if e["action"] == "optimization"] == [r["selected"]]


def test_a_structured_prune_beyond_the_drop_is_fine_tuned_back_within_it(trained):
    root = trained["root"]
    r = result_of(
        run_component(
            "optimize_model",
            "--model",
            str(root / "m"),
            "--data",
            str(trained["snap"]),
            "--output-dir",
            str(root / "o-s"),
            "--variants",
            '["pruned"]',
            "--pruning",
            "structured",
            "--sparsity",
            "0.5",
            "--latency-runs",
            "20",
        )
    )
    pruned = _variants(r)["pruned"]
    fp32 = _variants(r)["fp32"]["metric"]
    assert (
        pruned["fine_tuned_epochs"] == 2 and fp32 - pruned["metric_before_fine_tune"] > 0.005
    )  # pruning alone cost too much
    assert pruned["accepted"] and fp32 - pruned["metric"] <= 0.005 and r["selected"] == "pruned"
    assert pruned["sparsity"] == pytest.approx(
        0.5 * 64 * 64 / (64 * 64), abs=0.01
    )  # half the hidden units, whole rows of zeros
    # no variant within the drop: nothing is handed on, and that is a decision, not an error
    none = result_of(
        run_component(
            "optimize_model",
            "--model",
            str(root / "m"),
            "--data",
            str(trained["snap"]),
            "--output-dir",
            str(root / "o-n"),
            "--variants",
            '["pruned"]',
            "--sparsity",
            "0.95",
            "--fine-tune-epochs",
            "0",
            "--latency-runs",
            "20",
        )
    )
    assert none["selected"] is None and none["reason"].startswith(
        "every variant's accuracy drops beyond max_metric_drop 0.005 (pruned drops "
    )
    assert not (root / "o-n" / "model").exists() and (root / "o-n" / MARKER).exists()


#: The GRU's train_config (tests/fixtures/teampkg/sequence.py checks its types).
GRU_CONFIG = {"hidden": 16, "lr": 0.01, "note": "gru", "steps": [8, 8], "nested": {"depth": 1, "scale": 0.5}}


def test_a_model_with_nothing_to_prune_skips_pruned_by_default_and_refuses_it_when_asked(trained, mlflow_server):
    """A team's GRU, whose only Linear layer is its last: with the default variants, ``pruned`` is
    skipped with the reason in the result and the report and the other variants are made; asked
    for by name, ``pruned`` fails the step in one line (exit 2) and nothing is handed on."""
    root, snap = trained["root"], trained["snap"]
    gru = root / "gru"
    args = ["--data", str(snap), "--output-dir", str(gru), "--tracking-uri", mlflow_server, "--nproc-per-node", "1"]
    args += ["--epochs", "2", "--train-function", "teampkg.sequence:train", "--train-config", json.dumps(GRU_CONFIG)]
    result_of(run_component("train_model", *args, env=TEAM))
    out = root / "gru-o"
    r = result_of(
        run_component("optimize_model", "--model", str(gru), "--data", str(snap), "--output-dir", str(out), env=TEAM)
    )
    made = set(_variants(r))
    assert r["skipped"] == {"pruned": "the model has no Linear or Conv layer besides its last one to prune"}
    assert made == {"fp32", "onnx", "int8_dynamic", "int8_static"}, made
    assert "<ul id='skipped'><li>pruned: the model has no Linear or Conv layer" in (out / "report.html").read_text()
    asked = root / "gru-asked"
    proc = run_component(
        "optimize_model",
        "--model",
        str(gru),
        "--data",
        str(snap),
        "--output-dir",
        str(asked),
        "--variants",
        '["pruned"]',
        env=TEAM,
    )
    line = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 2 and line.endswith(
        "variants: pruned needs a Linear or Conv layer besides the last one, and this model has none"
    ), proc.stderr[-2000:]
    assert not (asked / MARKER).exists() and not (asked / "model").exists()


def test_the_report_renders_in_headless_chromium_with_a_row_and_a_point_per_variant(trained):
    from tests.helpers.browser import render

    page = render(trained["root"] / "o" / "report.html")
    assert page["errors"] == [] and page["title"] == "trainpipe optimization"
    assert [i["alt"] for i in page["images"]] == ["accuracy against p50 latency"]
    assert page["images"][0]["width"] >= 500 and page["images"][0]["height"] >= 300
    text = page["text"]
    assert f"selected {trained['result']['selected']}" in text and "1 thread(s)" in text
    for name in ("fp32", "onnx", "int8_dynamic", "int8_static", "pruned"):
        assert f"\n{name}\t" in text, name


def test_register_model_registers_the_variant_beside_the_model_and_it_loads_with_mlflow(
    trained, mlflow_server, digits_csv
):
    import mlflow
    import pandas as pd

    root = trained["root"]
    audit = root / "audit-register.jsonl"
    reg = result_of(
        run_component(
            "register_model",
            "--model",
            str(root / "m"),
            "--decision",
            str(root / "e"),
            "--optimized",
            str(root / "o"),
            "--output-dir",
            str(root / "r"),
            "--model-name",
            NAME,
            "--tracking-uri",
            mlflow_server,
            env={"TRAINPIPE_AUDIT_LOG": str(audit)},
        )
    )
    assert (
        reg["version"] == "1"
        and reg["optimized_version"] == "1"
        and reg["optimized_model_uri"] == f"models:/{NAME}-onnx/1"
    )
    client = mlflow.MlflowClient(mlflow_server)
    opt = client.get_model_version(f"{NAME}-onnx", "1")
    assert sorted(opt.aliases) == ["challenger", "champion"]  # the aliases the run set on its parent
    assert (
        opt.tags["trainpipe.parent_version"] == f"{NAME}/1"
        and opt.tags["trainpipe.variant"] == trained["result"]["selected"]
    )
    assert opt.tags["lineage.optimization.onnx_sha256"] == trained["result"]["model_sha256"]
    assert opt.tags["lineage.snapshot.md5"] == client.get_model_version(NAME, "1").tags["lineage.snapshot.md5"]
    assert client.get_model_version(NAME, "1").tags["trainpipe.optimized_version"] == f"{NAME}-onnx/1"
    assert (
        reg["lineage"]["optimization"]["version"] == "1"
        and reg["lineage"]["optimization"]["model_name"] == f"{NAME}-onnx"
    )
    records = [json.loads(line) for line in audit.read_text().splitlines()]
    assert {(r["decision"]["model_name"], r["decision"]["alias"]) for r in records if r["action"] == "alias"} == {
        (NAME, "challenger"),
        (NAME, "champion"),
        (f"{NAME}-onnx", "challenger"),
        (f"{NAME}-onnx", "champion"),
    }
    # the same DataFrame in, the same columns out as the fp32 version, predictions that agree (loaded
    # by alias in a process of its own, as a consumer would)
    pd.read_csv(digits_csv).drop(columns=["label"]).head(200).to_csv(root / "rows.csv", index=False)
    code = (
        "import json, mlflow, pandas as pd\n"
        "rows = pd.read_csv('rows.csv')\n"
        f"o = mlflow.pyfunc.load_model('models:/{NAME}-onnx@champion').predict(rows)\n"
        f"f = mlflow.pyfunc.load_model('models:/{NAME}@champion').predict(rows)\n"
        "print(json.dumps({'columns': [list(o.columns), list(f.columns)], 'agree': float((o['prediction'] == "
        "f['prediction']).mean())}))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=root,
        env={**env, "MLFLOW_TRACKING_URI": mlflow_server},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (
        out["columns"][0] == out["columns"][1] == ["prediction"] + [f"probability_{c}" for c in range(10)]
        and out["agree"] > 0.97
    )
    # a rerun registers nothing new
    again = result_of(
        run_component(
            "register_model",
            "--model",
            str(root / "m"),
            "--decision",
            str(root / "e"),
            "--optimized",
            str(root / "o"),
            "--output-dir",
            str(root / "r2"),
            "--model-name",
            NAME,
            "--tracking-uri",
            mlflow_server,
        )
    )
    assert again["created"] is False and again["optimized_version"] == "1"
    assert len(client.search_model_versions(f"name = '{NAME}-onnx'")) == 1


def _one_line(proc, start: str) -> None:
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith(f"trainpipe optimize_model: error: {start}"), proc.stderr[
        -500:
    ]


def _team_model(folder: Path, columns: list[str]) -> Path:
    """A team's model artifact (weights, description, completion marker) whose forward uses torch.kthvalue."""
    import sys

    sys.path.insert(0, str(REPO / "tests" / "fixtures"))
    try:
        from safetensors.torch import save_file
        from teampkg.odd import KthValueNet
    finally:
        sys.path.pop(0)
    from trainpipe.services.serving.loader import FORMAT

    folder.mkdir(parents=True)
    save_file(KthValueNet().state_dict(), str(folder / "model.safetensors"))
    (folder / "model.json").write_text(
        json.dumps(
            {
                "format": FORMAT,
                "builder": "teampkg.odd:KthValueNet",
                "init_args": {},
                "feature_columns": columns,
                "task": "classification",
                "classes": list(range(10)),
                "code": ["teampkg"],
            }
        )
    )
    finish_output(folder, "train_model", {"task": "classification"}, {})
    return folder


def test_bad_models_and_settings_are_one_line_exit_2_and_nothing_is_registered(trained, digits_csv, mlflow_server):
    import mlflow
    import pandas as pd

    root, snap = trained["root"], str(trained["snap"])
    columns = [c for c in pd.read_csv(digits_csv, nrows=1).columns if c != "label"]
    team = _team_model(root / "team", columns)
    _one_line(
        run_component(
            "optimize_model", "--model", str(team), "--data", snap, "--output-dir", str(root / "b1"), env=TEAM
        ),
        "model: ONNX cannot export it: no ONNX translation for the operator aten.kthvalue",
    )
    _one_line(
        run_component(
            "optimize_model",
            "--model",
            str(root / "m"),
            "--data",
            snap,
            "--output-dir",
            str(root / "b2"),
            "--pruning",
            "structured",
            "--sparsity",
            "0.995",
        ),
        "sparsity: 0.995 structured removes all 64 units of layer body.0; at most 0.984 keeps one",
    )
    _one_line(
        run_component(
            "optimize_model",
            "--model",
            str(root / "m"),
            "--data",
            snap,
            "--output-dir",
            str(root / "b3"),
            "--sparsity",
            "1",
        ),
        "optimize_model field 'sparsity': ",
    )
    pd.read_csv(digits_csv).head(0).to_csv(root / "no-rows.csv", index=False)
    empty = run_component(
        "optimize_model",
        "--model",
        str(root / "m"),
        "--data",
        snap,
        "--output-dir",
        str(root / "b4"),
        "--calibration-data",
        str(root / "no-rows.csv"),
    )
    _one_line(empty, "calibration_data: ")
    assert empty.stderr.strip().endswith("no-rows.csv' has no rows")
    for out in ("b1", "b2", "b3", "b4"):  # nothing half-written: no model, no completion marker
        assert not (root / out / "model").exists() and not (root / out / MARKER).exists(), out
    # a failed step hands register_model nothing to register
    proc = run_component(
        "register_model",
        "--model",
        str(root / "m"),
        "--decision",
        str(root / "e"),
        "--optimized",
        str(root / "b4"),
        "--output-dir",
        str(root / "rb"),
        "--model-name",
        "opt-bad",
        "--tracking-uri",
        mlflow_server,
    )
    assert proc.returncode == 2 and "optimized" in proc.stderr.strip().splitlines()[-1], proc.stderr[-500:]
    assert mlflow.MlflowClient(mlflow_server).search_registered_models(filter_string="name LIKE 'opt-bad%'") == []
