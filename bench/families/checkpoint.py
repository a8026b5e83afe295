"""What checkpoints cost a training on CPU, measured where the issue measured it: a model of about
100M parameters (builtin:mlp 64-7000-7000-7000-10: 98.6M parameters, 788 MB of weights and SGD
momentum), 2 gloo ranks × 1 thread on 2 cores, batch 64, a checkpoint every 10 steps, against the
same run without checkpoints and against a plain copy of the same state by hand (two processes at
once, as the two ranks copy); and how long a SIGTERM mid-epoch takes to a written checkpoint and
exit 75."""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import time
from typing import Any

from bench.common import PROBES, PY, Bench, alternate, digits_snapshot, row, train

HIDDEN = [7000, 7000, 7000]
STEPS, EVERY, BATCH, WARMUP = 40, 10, 64, 3
SHAPE = "builtin:mlp 64-7000-7000-7000-10 (98.6M parameters), 2 ranks × 1 thread, gloo, batch 64, 40 steps"


def plain_copy(processes: int = 2) -> float:
    """Seconds for a plain copy of the state, the median of the processes copying at once."""
    start = str(time.time() + 10)  # after each process has imported torch and built the state
    procs = [
        subprocess.Popen(
            [PY, str(PROBES / "state_copy.py"), ",".join(map(str, HIDDEN)), start, "cpu", "5"],
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(processes)
    ]
    return statistics.median(json.loads(p.communicate()[0])["s"] for p in procs)


def run(b: Bench) -> list[dict[str, Any]]:
    snap = digits_snapshot(b.work)
    runs: dict[str, list[dict[str, Any]]] = {"none": [], "every": []}

    def one(kind: str, every: int) -> float:
        _, _, tele, _ = train(
            b.work,
            snap,
            f"ckpt-{kind}",
            2,
            BATCH,
            2,
            max_steps=STEPS,
            checkpoint_every_steps=every,
            checkpoint_every_s=0,
            train_config={"hidden_units": HIDDEN, "learning_rate": 0.05},
        )
        steps = [s["step_s"] for s in tele["steps"]]
        runs[kind].append(
            {"steps": steps, "median": statistics.median(steps[WARMUP:]), "checkpoints": tele["checkpoints"]}
        )
        return runs[kind][-1]["median"]

    base, ours = alternate(lambda: one("none", 0), lambda: one("every", EVERY), b.repeats)
    copies = [plain_copy() for _ in range(b.repeats)]
    waits, costs = [], []
    for none, every in zip(runs["none"], runs["every"], strict=True):
        recent = every["checkpoints"]["recent"]
        mid = list(range(EVERY, STEPS, EVERY))  # the checkpoints before the last step's
        waits.append(
            statistics.mean(
                w + s for w, s in zip(recent["wait_s"][: len(mid)], recent["stall_s"][: len(mid)], strict=True)
            )
        )
        # the checkpoint's step (its staging) and the next (the write beside it), over two steps of the run without
        costs.append(statistics.mean(every["steps"][k - 1] + every["steps"][k] - 2 * none["median"] for k in mid))
    mb = runs["every"][-1]["checkpoints"]["staged_bytes"] / 1e6
    b.note(
        "checkpoint_cpu",
        {
            "state_mb": round(mb, 1),
            "plain_copy_s": [round(c, 4) for c in copies],
            "loop_wait_s": [round(w, 4) for w in waits],
            "cost_beside_the_write_s": [round(c, 4) for c in costs],
            "write_s": runs["every"][-1]["checkpoints"]["recent"]["write_s"],
        },
    )
    rows = [
        row(
            f"median step with a checkpoint every {EVERY} steps ({SHAPE})",
            "the same run without checkpoints",
            "s",
            base,
            ours,
            "≤ 1.10×",
            False,
            lambda r, *_: r <= 1.10,
        ),
        row(
            f"the loop's wait per checkpoint: staging {mb:.0f} MB into kept buffers (the write runs on a thread, "
            "around the page cache)",
            "a plain copy of the same state by hand (2 processes at once)",
            "s",
            copies,
            waits,
            "≤ 1.5×",
            False,
            lambda r, *_: r <= 1.5,
        ),
        row(
            "a checkpoint's whole cost to the loop: the step it ends and the next, beside the background write, over "
            "two steps without",
            "a plain copy of the same state by hand (2 processes at once)",
            "s",
            copies,
            costs,
            "report",
            False,
        ),
    ]
    return rows + [preemption(b, snap)]


def preemption(b: Bench, snap: Any) -> dict[str, Any]:
    """SIGTERM to train_model early in its second epoch: seconds to exit 75, the checkpoint written."""
    seconds = []
    for i in range(b.repeats):
        out = b.work / f"preempt-{i}"
        cmd = [
            PY,
            "-m",
            "trainpipe.components.train_model",
            "--data",
            str(snap),
            "--output-dir",
            str(out),
            "--nproc-per-node",
            "2",
            "--batch-size",
            str(BATCH),
            "--epochs",
            "2",
            "--train-config",
            json.dumps({"hidden_units": HIDDEN}),
            "--seed",
            "0",
            "--tracking-uri",
            f"sqlite:///{b.work / 'mlflow.db'}",
        ]
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
        while not (out / "metrics.jsonl").exists() and proc.poll() is None:
            time.sleep(0.05)
        time.sleep(2.0)
        proc.send_signal(signal.SIGTERM)
        t = time.perf_counter()
        err = proc.communicate()[1]
        if proc.returncode != 75 or "preempted by SIGTERM" not in err:
            from bench.common import BenchError

            raise BenchError(f"train_model did not stop with 75 on SIGTERM ({proc.returncode}):\n{err[-2000:]}")
        seconds.append(time.perf_counter() - t)
    return row(
        f"SIGTERM mid-epoch to exit 75, the checkpoint written ({SHAPE[:-10]})",
        "the 10 s the target allows",
        "s",
        [10.0] * len(seconds),
        seconds,
        "≤ 10 s",
        False,
        lambda r, *_: r <= 1.0,
    )
