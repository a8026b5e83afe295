"""Signed models: register_model's signing and every loader's verification (OpenSSF model-signing,
an elliptic-curve key pair) of a 256 MB model folder, in seconds per MB against ``sha256sum`` of the
same files (the hashing underneath both); and verification, model-signing's import included, as a
share of evaluate_model's wall time on the digits model (target ≤ 10 %): the import is timed after
what evaluate_model has imported when it loads its champion (a fresh process's figure is noted)."""

from __future__ import annotations

import os
import shutil
from typing import Any

from bench.common import PY, REPO, Bench, alternate, digits_snapshot, result, row, sh, train

PROBE = str(REPO / "bench" / "probes" / "sign_probe.py")


def run(b: Bench) -> list[dict[str, Any]]:
    from trainpipe.services import signing

    keys = b.work / "keys"
    keys.mkdir(exist_ok=True)
    signing.keypair(keys / "signing.pem", keys / "verify.pem")
    env = {signing.SIGNING_KEY_ENV: str(keys / "signing.pem"), signing.VERIFY_KEY_ENV: str(keys / "verify.pem")}
    big = b.work / "sign-model"
    shutil.rmtree(big, ignore_errors=True)
    big.mkdir()
    with open(big / "model.safetensors", "wb") as fh:  # incompressible, as weights are
        for _ in range(256):
            fh.write(os.urandom(1 << 20))
    (big / "model.json").write_text('{"builder": "bench"}')
    timed: dict[str, list[dict[str, float]]] = {"sha256sum": [], "sign": [], "verify": []}

    def sha() -> float:
        wall, _ = sh("sha256sum", str(big / "model.safetensors"), str(big / "model.json"))
        timed["sha256sum"].append({"wall_s": wall})
        return wall / 256

    def probe(mode: str) -> float:
        _, out = sh(PY, PROBE, mode, str(big), env=env)
        timed[mode].append(result(out))
        return timed[mode][-1]["work_s"] / timed[mode][-1]["mb"]

    sha_s, sign_s = alternate(sha, lambda: probe("sign"), b.repeats)
    sha2_s, verify_s = alternate(sha, lambda: probe("verify"), b.repeats)

    # verification beside the step that does it: evaluate_model on the digits model, and the same model verified
    snap = digits_snapshot(b.work)
    train(b.work, snap, "sign-digits", 1, 64, 3)
    shutil.rmtree(b.work / "sign-digits-signed", ignore_errors=True)
    small = b.work / "sign-digits-signed"
    small.mkdir()
    for f in ("model.safetensors", "model.json"):
        shutil.copyfile(b.work / "sign-digits" / f, small / f)
    sh(PY, PROBE, "sign", str(small), env=env)
    evals: list[float] = []

    def evaluate() -> float:
        shutil.rmtree(b.work / "sign-eval", ignore_errors=True)
        wall, _ = sh(
            PY,
            "-m",
            "trainpipe.components.evaluate_model",
            "--model",
            str(b.work / "sign-digits"),
            "--data",
            str(snap),
            "--output-dir",
            str(b.work / "sign-eval"),
            "--thresholds",
            '{"accuracy": 0.5}',
        )
        evals.append(wall)
        return wall

    cold: list[dict[str, float]] = []

    def verify_small() -> float:
        _, out = sh(PY, PROBE, "verify-in-evaluate", str(small), env=env)
        r = result(out)
        _, out = sh(PY, PROBE, "verify", str(small), env=env)  # and in a fresh process, for the record
        cold.append(result(out))
        return r["import_s"] + r["work_s"]

    eval_s, ver_s = alternate(evaluate, verify_small, b.repeats)
    b.note(
        "signing",
        {
            "model_mb": 256,
            "timings": timed,
            "evaluate_wall_s": evals,
            "verify_in_a_fresh_process": cold,
            "digits_model_mb": sum(p.stat().st_size for p in small.iterdir()) / 1e6,
        },
    )
    return [
        row(
            "signing a 256 MB model (model-signing, EC key), s/MB",
            "sha256sum of the same files, s/MB",
            "s/MB",
            sha_s,
            sign_s,
            "report",
            False,
        ),
        row(
            "verifying a 256 MB model before loading it, s/MB",
            "sha256sum of the same files, s/MB",
            "s/MB",
            sha2_s,
            verify_s,
            "report",
            False,
        ),
        row(
            "verifying the digits model (model-signing's import included) vs evaluate_model's wall",
            "evaluate_model on the same model",
            "s",
            eval_s,
            ver_s,
            "≤ 0.1×",
            False,
            lambda r, mb, mo: r <= 0.1,
            note="what verification adds to evaluate_model: model-signing imported after what the step has imported by "
            "then",
        ),
    ]
