"""The one timing both inference benchmarks use: p50/p99 latency of 500 single-row calls and rows a
second at batch 256 (at least 1 s of batches), after a warm-up."""

import time

import numpy as np


def time_predict(predict, rows: np.ndarray, calls: int = 500, seconds: float = 1.0) -> dict:
    singles = [np.ascontiguousarray(rows[i % len(rows)][None, :]) for i in range(calls)]
    batch = np.ascontiguousarray(np.resize(rows, (256, rows.shape[1])))
    for x in singles[:20]:
        predict(x)
    predict(batch)
    times = []
    for x in singles:
        t = time.perf_counter()
        predict(x)
        times.append(time.perf_counter() - t)
    n, start = 0, time.perf_counter()
    while n < 10 or time.perf_counter() - start < seconds:
        predict(batch)
        n += 1
    p50, p99 = np.percentile(np.asarray(times) * 1000, [50, 99])
    return {"p50_ms": float(p50), "p99_ms": float(p99), "rows_per_s": n * 256 / (time.perf_counter() - start)}
