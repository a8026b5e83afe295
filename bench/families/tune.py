"""tune_model against the same trainings run by hand in a loop: a study of 4 trials (digits, builtin:mlp,
2 gloo ranks, 3 epochs, no pruning, a seeded sampler) on SQLite, and the 4 train_model commands those
trials ran (their configs, as the study wrote them) one after another. The difference per trial is
what the study adds: Optuna's storage, the tuning rows written once, the MLflow parent run, scoring
each model on the validation rows, the summary and its HTML report."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from bench.common import PY, Bench, BenchError, alternate, digits_snapshot, row, sh

TRIALS = 4
SPACE = {
    "train_config.learning_rate": {"type": "float", "low": 0.01, "high": 0.2, "log": True},
    "batch_size": {"type": "categorical", "choices": [32, 64]},
}


def run(b: Bench) -> list[dict[str, Any]]:
    snap = digits_snapshot(b.work)
    track = f"sqlite:///{b.work / 'tune-mlflow.db'}"
    n = [0]
    configs: list[Path] = []

    def study() -> float:
        n[0] += 1
        out = b.work / f"tune-{n[0]}"
        wall, _ = sh(
            PY,
            "-m",
            "trainpipe.components.tune_model",
            "--data",
            str(snap),
            "--output-dir",
            str(out),
            "--space",
            json.dumps(SPACE),
            "--train",
            json.dumps({"epochs": 3, "nproc_per_node": 2, "checkpoint_every_steps": 0}),
            "--n-trials",
            str(TRIALS),
            "--pruner",
            "none",
            "--tracking-uri",
            track,
        )
        if not configs:
            configs.extend(sorted((out / "studies").glob("*/trial-*.json")))  # each study its own trials
        return wall

    def by_hand() -> float:
        n[0] += 1
        t = time.perf_counter()
        for cfg in configs:
            settings = json.loads(cfg.read_text())
            settings["output_dir"] = str(b.work / f"hand-{n[0]}" / cfg.stem)
            path = b.work / f"hand-{n[0]}-{cfg.name}"
            path.write_text(json.dumps(settings))
            sh(PY, "-m", "trainpipe.components.train_model", "--config", str(path))
        return time.perf_counter() - t

    study()  # the trials' configs for the loop by hand, the MLflow store, warm caches: not counted
    if len(configs) != TRIALS:  # a baseline of no trainings would make any study look slow
        raise BenchError(f"the study wrote {len(configs)} trial configs, not {TRIALS}")
    base, ours = alternate(by_hand, study, max(2, b.repeats - 1))
    return [
        row(
            f"tune_model, {TRIALS} trials (digits, 2 gloo ranks each, 3 epochs, SQLite study)",
            f"the same {TRIALS} train_model commands run by hand in a loop",
            "s",
            base,
            ours,
            "≤ +2 s per trial",
            False,
            lambda r, mb, mo: (mo - mb) / TRIALS <= 2.0,
        )
    ]
