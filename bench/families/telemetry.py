"""Live telemetry on against off: train_model's built-in MLP with every rank serving /metrics and
rank 0's endpoint (the whole node's series) scraped every second, as a Prometheus at a 1 s
interval would (a pessimistic rate: the PodMonitor scrapes every 15 s). On two busy cores a pair
of whole runs swings by ±20 %, so the cost is also measured where it is spent: one scrape of a
rank (folding a second of step records, rendering the text), as a share of the second between
scrapes."""

from __future__ import annotations

import socket
import statistics
import threading
import time
import types
import urllib.request
from typing import Any

from bench.common import Bench, alternate, digits_snapshot, row, steady_sps, train

EPOCHS, BATCH = 6, 64


def _port_pair() -> int:
    for _ in range(50):
        with socket.socket() as a, socket.socket() as b:
            a.bind(("127.0.0.1", 0))
            port = a.getsockname()[1]
            try:
                b.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
            return port
    raise RuntimeError("no two adjacent free ports")


class _Scraper(threading.Thread):
    """GET rank 0's /metrics every second until stopped; counts the scrapes that answered."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.url, self.stop, self.ok = f"http://127.0.0.1:{port}/metrics", threading.Event(), 0

    def run(self) -> None:
        while not self.stop.wait(1.0):
            try:
                with urllib.request.urlopen(self.url, timeout=1) as r:
                    self.ok += b"trainpipe_training_samples_total" in r.read()
            except OSError:
                pass


def run(b: Bench) -> list[dict[str, Any]]:
    snap = digits_snapshot(b.work, 16)
    scrapes: list[int] = []

    def off() -> float:
        return steady_sps(train(b.work, snap, "tele-off", 2, BATCH, EPOCHS, metrics_port=0)[2])

    def on() -> float:
        port = _port_pair()
        scraper = _Scraper(port)
        scraper.start()
        try:
            tele = train(
                b.work,
                snap,
                "tele-on",
                2,
                BATCH,
                EPOCHS,
                env={"TRAINPIPE_METRICS_ADDRESS": "127.0.0.1"},
                metrics_port=port,
            )[2]
        finally:
            scraper.stop.set()
            scraper.join()
        scrapes.append(scraper.ok)
        return steady_sps(tele)

    base, ours = alternate(off, on, max(b.repeats, 8))  # 2-core noise: pairs differ by ±20 %
    if not all(scrapes):
        from bench.common import BenchError

        raise BenchError(f"telemetry: a run with telemetry on answered no scrape ({scrapes})")
    b.note("telemetry_scrapes_per_run", scrapes)
    steps_per_s = statistics.median(ours) / BATCH  # batches a rank runs in the second between two scrapes
    return [
        row(
            "train_model with live telemetry on, scraped every second (builtin:mlp, DDP 2 ranks × 1 thread, gloo, 16× "
            "digits, batch 64, "
            f"{EPOCHS} epochs)",
            "the same run with telemetry off",
            "samples/s",
            base,
            ours,
            "≥ 0.99",
            True,
            lambda r, *_: r >= 0.99,
            note=f"scrapes answered per run: {min(scrapes)}–{max(scrapes)}",
        ),
        scrape_cost(b, int(steps_per_s)),
    ]


def scrape_cost(b: Bench, steps_per_s: int) -> dict[str, Any]:
    """CPU time of one scrape of a rank that ran ``steps_per_s`` batches since the last one, against
    the second between scrapes: the share of a core telemetry takes at a 1 s scrape interval."""
    from prometheus_client.exposition import generate_latest

    from trainpipe.services.telemetry import TrainingCollector, _Node

    record = {
        "epoch": 0,
        "step": 1,
        "samples": BATCH // 2,
        "data_s": 1e-4,
        "forward_s": 1e-3,
        "backward_s": 2e-3,
        "optimizer_s": 3e-4,
        "other_s": 1e-4,
        "step_s": 3.5e-3,
        "t": 1.0,
    }
    ctx = types.SimpleNamespace(
        settings=types.SimpleNamespace(
            backend="torch_ddp", precision="fp32", epochs=EPOCHS, train_function="builtin:mlp"
        ),
        rank=0,
        world_size=2,
        dist_name="gloo",
        global_step=0,
        epoch=0,
        batches_done=0,
        step_records=[],
        restarts=0,
        last_checkpoint_unix=time.time(),
        progress_ratio=lambda: 0.5,
        eta_seconds=lambda: 10.0,
        learning_rate=lambda: 0.05,
        last_logged=lambda: {"loss": 0.1, "accuracy": 0.9},
        device_figures=lambda: {},
    )
    node = _Node(TrainingCollector(ctx, {"run_id": "bench", "hardware_profile": "cpu", "model": "builtin:mlp"}), None)
    per_scrape = []
    for _ in range(max(b.repeats, 5)):
        times = []
        for _ in range(50):
            ctx.step_records.extend(
                dict(record) for _ in range(steps_per_s)
            )  # the loop's appends are its own cost, not telemetry's
            t0 = time.process_time()
            generate_latest(node)  # type: ignore[arg-type]
            times.append(time.process_time() - t0)
        per_scrape.append(statistics.median(times) * 1000)
    return row(
        f"one scrape of a rank, {steps_per_s} batches since the last (fold + render), as a share of the 1 s between "
        "scrapes",
        "the scrape interval",
        "ms",
        [1000.0] * len(per_scrape),
        per_scrape,
        "≤ 0.01 (1 % of a core)",
        False,
        lambda r, *_: r <= 0.01,
        note="CPU time on the metrics server's thread; the step itself does nothing more",
    )
