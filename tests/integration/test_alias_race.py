"""A registration that lost the race for the serving alias, on a real MLflow server: two models of one snapshot,
each passed by a gate that found no champion; the first registered takes the alias, and the second, whose gate
compared it with nobody, compares itself once with the new holder's recorded metrics (same data, same split):
the better model moves the alias forward, the worse one stays challenger (issue 53, §2)."""

from __future__ import annotations

import pytest

from tests.conftest import make_snapshot, result_of, run_component

pytestmark = pytest.mark.integration


def _trained(root, snapshot, server, epochs: int) -> tuple[str, str, dict]:
    """train_model then evaluate_model (against the serving alias of ``race``, which does not exist yet)."""
    model, decision = root / f"m{epochs}", root / f"e{epochs}"
    result_of(
        run_component(
            "train_model",
            *("--data", str(snapshot), "--output-dir", str(model), "--label-column", "target"),
            *("--epochs", str(epochs), "--batch-size", "16", "--nproc-per-node", "1", "--tracking-uri", server),
        )
    )
    ev = result_of(
        run_component(
            "evaluate_model",
            *("--model", str(model), "--data", str(snapshot), "--output-dir", str(decision)),
            *("--label-column", "target", "--model-name", "race", "--tracking-uri", server),
        )
    )
    assert ev["decision"]["passed"] and not ev["decision"]["compared_with_champion"], ev["decision"]
    return str(model), str(decision), ev["metrics"]


def _register(root, server, model: str, decision: str, out: str) -> dict:
    return result_of(
        run_component(
            "register_model",
            *("--model", model, "--decision", decision, "--output-dir", str(root / out)),
            *("--tracking-uri", server, "--model-name", "race"),
        )
    )


def test_the_registration_that_lost_the_race_compares_once_with_the_new_champion(tmp_path, tiny_csv, mlflow_server):
    import mlflow

    snapshot = make_snapshot(tmp_path, tiny_csv)
    short, long_ = (_trained(tmp_path, snapshot, mlflow_server, n) for n in (1, 4))
    assert short[2]["accuracy"] != long_[2]["accuracy"], "the two models must differ for the race to mean anything"
    worse, better = sorted((short, long_), key=lambda t: t[2]["accuracy"])
    first = _register(tmp_path, mlflow_server, worse[0], worse[1], "r1")
    assert first["champion_moved"] and first["version"] == "1", first["reason"]
    second = _register(tmp_path, mlflow_server, better[0], better[1], "r2")
    assert second["version"] == "2" and second["champion_moved"], second["reason"]
    assert "compared once with version 1: better" in second["reason"], second["reason"]
    client = mlflow.MlflowClient(mlflow_server)
    assert client.get_model_version_by_alias("race", "champion").version == "2"
    # the worse model of the same gate's kind, registered once more after it: compared with version 2, it stays
    # challenger (an identical model reuses version 1, older than the champion: the alias never moves back)
    again = _register(tmp_path, mlflow_server, worse[0], worse[1], "r3")
    assert again["version"] == "1" and not again["champion_moved"], again["reason"]
    assert client.get_model_version_by_alias("race", "champion").version == "2"
