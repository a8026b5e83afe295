"""What scheduling and compiling cost: each DAG file's parse time against an empty DAG (and, in
kubernetes mode, against a DAG of one KubernetesPodOperator), and `trainpipe compile`.

Each DAG file is parsed alone in its own dags folder by an `airflow dags report` process of its
own, as Airflow's DAG processor parses every file: in one shared folder the first file parsed
would pay for the modules the others reuse."""

from __future__ import annotations

import json
import shutil
import statistics
from pathlib import Path
from typing import Any

from bench.common import BASELINES, PY, REPO, Bench, alternate, row, sh


def dag_parse(b: Bench) -> list[dict[str, Any]]:
    files = {
        "empty": BASELINES / "empty_dag.py",
        "kpo": BASELINES / "kpo_dag.py",
        "training": REPO / "dags" / "training_dag.py",
        "retrain": REPO / "dags" / "retrain_dag.py",
    }
    for name, src in files.items():
        (b.work / "dags" / name).mkdir(parents=True, exist_ok=True)
        shutil.copy(src, b.work / "dags" / name / src.name)
    env = {"AIRFLOW_HOME": str(b.work / "airflow"), "AIRFLOW__CORE__LOAD_EXAMPLES": "False"}
    sh(PY, "-m", "airflow", "db", "migrate", env=env)

    def parse(name: str, mode: str = "local") -> float:
        _, out = sh(
            PY,
            "-m",
            "airflow",
            "dags",
            "report",
            "-o",
            "json",
            env={**env, "AIRFLOW__CORE__DAGS_FOLDER": str(b.work / "dags" / name), "TRAINPIPE_AIRFLOW_MODE": mode},
        )
        (report,) = json.loads(next(line for line in out.splitlines() if line.startswith("[{")))
        d = str(report["duration"])  # "H:MM:SS.ffffff"
        return float(d.split(":")[-1]) + 60 * float(d.split(":")[-2]) if ":" in d else float(d)

    rows = [
        row(
            f"DAG parse: {name}_dag.py, local mode (airflow dags report, file alone)",
            "an empty DAG file",
            "s",
            *alternate(lambda: parse("empty"), lambda n=name: parse(n), b.repeats),
            "≤ +50 ms",
            False,
            lambda r, mb, mo: mo - mb <= 0.05,
        )
        for name in ("training", "retrain")
    ]
    rows.append(
        row(
            "DAG parse: training_dag.py, kubernetes mode (file alone)",
            "a DAG of one KubernetesPodOperator",
            "s",
            *alternate(lambda: parse("kpo"), lambda: parse("training", "kubernetes"), b.repeats),
            "≤ +50 ms",
            False,
            lambda r, mb, mo: mo - mb <= 0.05,
            note="importing Airflow's cncf.kubernetes provider costs both about a second",
        )
    )
    return rows


def compile_(b: Bench) -> list[dict[str, Any]]:
    cli = str(Path(PY).parent / "trainpipe")
    times = [sh(cli, "compile", "--profile", "cpu", "-o", str(b.work / "p.yaml"))[0] for _ in range(b.repeats)]
    med = statistics.median(times)
    return [
        {
            "benchmark": "trainpipe compile (process wall)",
            "baseline": "—",
            "unit": "s",
            "baseline_median": None,
            "trainpipe_median": med,
            "ratio_median": None,
            "ratio_min": min(times),
            "ratio_max": max(times),
            "repeats": len(times),
            "target": "≤ 2 s",
            "met": med <= 2.0,
            "higher_is_better": False,
            "note": "",
        }
    ]
