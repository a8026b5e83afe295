"""Evaluate, gate against the champion, register with aliases, and trace the lineage, on a
real MLflow server backed by PostgreSQL (as in production) and a real DVC remote."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import make_snapshot, result_of, run_component

pytestmark = pytest.mark.integration

NAME = "digits-classifier"


@pytest.fixture(scope="module")
def chain(tmp_path_factory, digits_csv):
    """validate_data → snapshot_dataset on the digits, with a local DVC remote."""
    root = tmp_path_factory.mktemp("chain")
    make_snapshot(root, digits_csv, "label", dataset_name="digits")
    return root


def _train(chain: Path, out: str, server: str, *extra: str) -> dict:
    return result_of(
        run_component(
            "train_model",
            "--data",
            str(chain / "s"),
            "--output-dir",
            str(chain / out),
            "--tracking-uri",
            server,
            "--nproc-per-node",
            "1",
            "--checkpoint-every-steps",
            "0",
            *extra,
        )
    )


def _evaluate(chain: Path, model: str, out: str, server: str) -> dict:
    return result_of(
        run_component(
            "evaluate_model",
            "--model",
            str(chain / model),
            "--data",
            str(chain / "s"),
            "--output-dir",
            str(chain / out),
            "--thresholds",
            '{"accuracy": 0.3}',
            "--model-name",
            NAME,
            "--tracking-uri",
            server,
        )
    )


def _register(chain: Path, model: str, decision: str, out: str, server: str) -> dict:
    return result_of(
        run_component(
            "register_model",
            "--model",
            str(chain / model),
            "--decision",
            str(chain / decision),
            "--output-dir",
            str(chain / out),
            "--model-name",
            NAME,
            "--tracking-uri",
            server,
        )
    )


def test_champion_lifecycle_on_postgres(chain, mlflow_server_postgres):
    """Slow on purpose (about a minute): several real trainings are registered in turn on a PostgreSQL-backed
    tracking server, since the champion's moves between them are what is checked."""
    import mlflow
    import numpy as np
    import pandas as pd

    from trainpipe.services import registry
    from trainpipe.services.serving import loader

    server = mlflow_server_postgres
    mlflow.set_tracking_uri(server)
    client = mlflow.MlflowClient(server)
    # A weak model first: no champion yet, so the thresholds alone decide, and it becomes champion.
    _train(chain, "weak", server, "--epochs", "1", "--train-config", '{"learning_rate": 0.005}')
    ev1 = _evaluate(chain, "weak", "e1", server)
    assert ev1["decision"]["passed"] and not ev1["decision"]["compared_with_champion"]
    assert "no champion yet: decided by the absolute thresholds alone" in ev1["decision"]["reasons"]
    assert set(ev1["metrics"]) >= {"accuracy", "f1_macro", "precision_macro", "recall_macro", "roc_auc", "log_loss"}
    assert len(ev1["per_class"]) == 10 and len(ev1["confusion_matrix"]) == 10
    r1 = _register(chain, "weak", "e1", "r1", server)
    assert (
        r1["created"] and r1["version"] == "1" and r1["aliases"] == ["challenger", "champion"] and r1["champion_moved"]
    )
    # Registering the same model and data again creates nothing.
    again = _register(chain, "weak", "e1", "r1b", server)
    assert not again["created"] and again["version"] == "1"
    assert len(client.search_model_versions(f"name = '{NAME}'")) == 1

    # A better model: compared with champion version 1 on the same rows, it wins and takes the alias.
    strong = _train(chain, "strong", server, "--epochs", "6")
    ev2 = _evaluate(chain, "strong", "e2", server)
    d2 = ev2["decision"]
    assert d2["compared_with_champion"] and d2["beats_champion"] and d2["champion"]["version"] == "1"
    assert d2["champion"]["metrics"]["accuracy"] == pytest.approx(ev1["metrics"]["accuracy"])
    r2 = _register(chain, "strong", "e2", "r2", server)
    assert r2["version"] == "2" and r2["champion_moved"] and r2["aliases"] == ["challenger", "champion"]
    assert client.get_model_version_by_alias(NAME, "champion").version == "2"

    # The weak model again: now it regresses against champion 2, the gate fails, nothing moves.
    ev3 = _evaluate(chain, "weak", "e3", server)
    assert not ev3["decision"]["passed"] and any("vs champion version 2" in f for f in ev3["decision"]["failures"])
    r3 = _register(chain, "weak", "e3", "r3", server)
    assert not r3["registered"] and client.get_model_version_by_alias(NAME, "champion").version == "2"

    # The champion loads back by alias (MLflow's pyfunc, from raw columns) and predicts exactly as the trained model
    # does.
    df = pd.read_csv(chain / "s" / "digits.csv").drop(columns=["label"]).head(50)
    got = mlflow.pyfunc.load_model(f"models:/{NAME}@champion").predict(df)
    mine = loader.load(chain / "strong").predict_frame(df)
    assert list(got["prediction"]) == list(mine["prediction"])
    assert np.allclose(
        got.drop(columns=["prediction"]).to_numpy(float), mine.drop(columns=["prediction"]).to_numpy(float), atol=1e-6
    )

    # The version carries a signature, a model card, the lineage, and the run its dataset input.
    mv = client.get_model_version(NAME, "2")
    assert mv.tags["trainpipe.model_sha256"] == strong["model_sha256"] and "Model card" in mv.description
    info = mlflow.models.get_model_info(f"models:/{NAME}/2")
    assert info.signature is not None and info.signature.inputs.to_dict()
    card = (chain / "r2" / "model_card.md").read_text()
    assert "## Intended use" in card and "Compared with champion version 1" in card and "| accuracy |" in card
    run = client.get_run(strong["mlflow_run_id"])
    inputs = run.inputs.dataset_inputs
    assert inputs and inputs[0].dataset.name == "digits.csv" and any(t.value == "training" for t in inputs[0].tags)
    # the weights-only copy a later gate rebuilds the champion from lies inside the version's MLflow model
    weights = registry.download_weights(client, mv, chain / "downloaded")
    assert (weights / "model.safetensors").read_bytes() == (chain / "strong" / "model.safetensors").read_bytes()


def test_a_model_trained_without_a_snapshot_registers_and_says_what_its_lineage_lacks(chain, mlflow_server_postgres):
    """A team's DAG without snapshot_dataset (nor validate_data): train_model read a file it named. The model
    registers; the lineage, the version's tags and the model card say what the chain lacks."""
    import mlflow

    from trainpipe.components.register_model.core import register_model
    from trainpipe.components.register_model.spec import RegisterModelConfig
    from trainpipe.contract.artifacts import read_artifact
    from trainpipe.contract.lineage import Lineage

    # A training of its own: registering another test's training run would replace that run's
    # trainpipe/lineage.json, which `trainpipe lineage` reads for the champion.
    _train(chain, "nosnap", mlflow_server_postgres, "--epochs", "1")
    model = chain / "nosnap"
    lineage = Lineage.of(read_artifact(model, "model").lineage).with_(snapshot=None, validation=None, source=None)
    (chain / "e-nosnap").mkdir()
    (chain / "e-nosnap" / "decision.json").write_text(json.dumps({"passed": True, "metrics": {"accuracy": 0.9}}))
    name = "digits-no-snapshot"
    config = RegisterModelConfig(
        model=str(model),
        decision=str(chain / "e-nosnap"),
        output_dir=str(chain / "r-nosnap"),
        model_name=name,
        tracking_uri=mlflow_server_postgres,
    )
    result = register_model(config, lineage)
    assert result.registered and result.champion_moved
    assert result.lineage.registration.lacks == ["validation", "snapshot"]
    tags = mlflow.MlflowClient(mlflow_server_postgres).get_model_version(name, result.version).tags
    assert tags["lineage.registration.lacks"] == "validation,snapshot"
    card = (chain / "r-nosnap" / "model_card.md").read_text()
    assert "not validated (no validate_data ran)" in card and "Snapshot: none (no snapshot_dataset ran)" in card


def test_evaluation_report_renders_in_headless_chromium_with_its_charts(chain):
    from tests.helpers.browser import render

    page = render(chain / "e2" / "report.html")
    assert page["errors"] == [] and page["title"] == "trainpipe evaluation"
    assert [i["alt"] for i in page["images"]] == ["Confusion matrix", "ROC curves", "Precision-recall curves"]
    assert all(i["width"] > 100 and i["height"] > 100 for i in page["images"])
    assert "gate passed" in page["text"] and "vs champion version 1" in page["text"]


def _lineage(server: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "trainpipe.app.cli", "lineage", *args, "--tracking-uri", server],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_lineage_command_prints_the_chain_and_verifies_the_snapshot(chain, mlflow_server_postgres):
    proc = _lineage(mlflow_server_postgres, f"models:/{NAME}@champion")
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    snap = json.loads((chain / "s" / "trainpipe.json").read_text())["lineage"]["snapshot"]
    for needle in (
        f"{NAME} version 2",
        "evaluation",
        "training   MLflow run",
        f"DVC md5 {snap['md5']}",
        "raw data",
        "verify     OK",
    ):
        assert needle in out, out
    doc = json.loads(_lineage(mlflow_server_postgres, f"models:/{NAME}/2", "--json").stdout)
    assert doc["verification"]["ok"] and doc["lineage"]["snapshot"]["md5"] == snap["md5"]
    assert doc["lineage"]["source"]["md5"] and doc["lineage"]["validation"]["success"]

    # Tamper with the remote's copy: verification fails, with a clear line, exit 3.
    stored = [p for p in (chain / "remote").rglob("*") if p.is_file()]
    assert len(stored) == 1
    original = stored[0].read_bytes()
    stored[0].chmod(0o644)
    stored[0].write_bytes(original.replace(b"0", b"1", 1))
    try:
        bad = _lineage(mlflow_server_postgres, f"models:/{NAME}@champion")
        assert bad.returncode == 3
        assert "verify     FAILED" in bad.stdout and "the remote's copy changed" in bad.stdout
    finally:
        stored[0].write_bytes(original)


def test_lineage_of_an_unknown_alias_is_a_one_line_error(mlflow_server_postgres):
    proc = _lineage(mlflow_server_postgres, f"models:/{NAME}@nobody")
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1].startswith("trainpipe: error: model_uri:")
    proc = _lineage(mlflow_server_postgres, "runs:/abc/model")
    assert proc.returncode == 2 and "is not models:/<name>@<alias>" in proc.stderr


def _alias_race_setup(server: str, name: str):
    import mlflow

    from trainpipe.components.register_model.spec import RegisterModelConfig

    client = mlflow.MlflowClient(server)
    client.create_registered_model(name)
    config = RegisterModelConfig(model="m", decision="d", output_dir="o", model_name=name, tracking_uri=server)
    return client, config


def _new_version(client, name: str) -> str:
    """A version to move the alias to (the alias move reads nothing of its model)."""
    return str(client.create_model_version(name, source=f"s3://trainpipe-test/{name}").version)


def _released_together(server: str, config, decision: dict, versions: list[str]) -> dict:
    """register_model's alias move for each version, in threads released at the same instant, each with its
    own client as a second process would have: what each returned or raised."""
    import threading

    import mlflow

    from trainpipe.components.register_model.core import set_aliases

    barrier = threading.Barrier(len(versions))
    outcomes: dict[str, object] = {}

    def register(version: str) -> None:
        own = mlflow.MlflowClient(server)
        barrier.wait()
        try:
            outcomes[version] = set_aliases(own, config, decision, version, True, None)
        except Exception as exc:  # noqa: BLE001 (AliasMoved, or what the assertion shows)
            outcomes[version] = exc

    threads = [threading.Thread(target=register, args=(v,)) for v in versions]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return outcomes


def test_two_registrations_released_together_move_the_alias_once(mlflow_server_postgres):
    """Two register_model steps whose gates both beat the champion, released at the same instant
    (a barrier), many times: each time one moves the alias and the other is refused (exit 10),
    naming the new holder; neither replaces a version it was not compared with."""
    from trainpipe.contract.errors import AliasMoved

    name = "alias-race"
    client, config = _alias_race_setup(mlflow_server_postgres, name)
    champion = _new_version(client, name)
    client.set_registered_model_alias(name, "champion", champion)
    for _ in range(6):
        decision = {"passed": True, "beats_champion": True, "champion": {"version": champion}, "model_name": name}
        versions = [_new_version(client, name), _new_version(client, name)]
        outcomes = _released_together(mlflow_server_postgres, config, decision, versions)
        moved = [v for v in versions if isinstance(outcomes[v], tuple) and outcomes[v][0]]
        refused = [v for v in versions if isinstance(outcomes[v], AliasMoved)]
        assert len(moved) == 1 and len(refused) == 1, outcomes
        assert str(client.get_model_version_by_alias(name, "champion").version) == moved[0]
        assert f"champion is now version {moved[0]}" in str(outcomes[refused[0]])
        champion = moved[0]
    assert not client.search_registered_models(filter_string=f"name LIKE '{name}\\_\\_%'")  # every lease released


def test_a_lease_a_dead_holder_left_is_broken_and_a_live_one_waited_for(mlflow_server_postgres):
    from trainpipe.contract.errors import ServiceUnavailable
    from trainpipe.services import registry

    name = "alias-lease"
    client, _ = _alias_race_setup(mlflow_server_postgres, name)
    lease = registry.lease_name(name)
    client.create_registered_model(lease, tags={registry.LEASE_OWNER_TAG: "host:1:dead"})
    with pytest.raises(ServiceUnavailable) as exc:
        with registry.alias_lease(client, name, ttl_s=60, wait_s=0.3):
            pass
    assert exc.value.exit_code == 75 and "held by host:1:dead" in str(exc.value)
    with registry.alias_lease(client, name, ttl_s=0.3, wait_s=10):  # seen unchanged for ttl_s: broken
        assert client.get_registered_model(lease).tags[registry.LEASE_OWNER_TAG] != "host:1:dead"
    left = [m.name for m in client.search_registered_models(filter_string=f"name LIKE '{lease}%'")]
    assert len(left) == 1 and left[0].startswith(f"{lease}__broken_")  # released; the dead one's, renamed, stays
