"""Live telemetry: every training rank's figures in the Prometheus format while it runs. (A
component's batch-job figures, pushed to a Pushgateway when it ends, are ``trainpipe.contract.push``;
progress with rate and ETA in the task log is ``trainpipe.contract.progress``: the entrypoint and the
dataset hash use them, below the services.)

**One endpoint per rank** (``metrics_port + local rank``), not prometheus_client's multiprocess
mode. Each rank is its own process under every launcher trainpipe uses (torchrun, horovodrun,
its own one-node launcher for TensorFlow, and Slurm's ``srun`` later), so an endpoint per process
needs no directory the ranks agree on and no cleanup of a dead process's files, and a restarted
rank simply binds its port again (its counters start over, which ``rate()`` handles). The
multiprocess mode sums counters over every process that ever wrote to the directory, restarted
ones included, and still needs one server per node. **Local rank 0 answers for its node**: its
``/metrics`` adds the series its local peers serve (read over loopback when it is scraped), so
one target per pod (``metrics_port``, the pod's ``prometheus.io/port``) covers every rank and no
container port needs declaring; ``/metrics?ranks=self`` gives its own series only.

**Read at scrape time.** The training loop already records each step's times (the telemetry
profile_training reads); the collector folds the records added since the last scrape into its
counters and histogram on the HTTP server's thread. The step itself does nothing more, so
telemetry costs the loop nothing measurable (``make bench``: telemetry on vs off).

**Never fails a run.** A port taken, or a Pushgateway down, is one warning line on stderr.

Stdlib at import; prometheus_client (pure Python) is imported only when serving.
"""

from __future__ import annotations

import json
import os
import platform
import resource
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from trainpipe.contract.push import label as _label
from trainpipe.contract.push import warn

#: Labels every training series carries (JSON), set by train_model for its ranks.
LABELS_ENV = "TRAINPIPE_METRICS_LABELS"
#: Where a rank's endpoint listens (default: every interface, as a pod's must).
ADDRESS_ENV = "TRAINPIPE_METRICS_ADDRESS"
#: At most this long a finished rank waits for Prometheus to scrape its final figures (default 30 s).
LINGER_ENV = "TRAINPIPE_METRICS_LINGER_S"
LABEL_NAMES = ("run_id", "component", "rank", "node", "hardware_profile", "model")
STEP_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
#: The parts of a step the loop times (torch: data, forward, backward, optimizer, other;
#: TensorFlow: data, compute, other). Under DDP, gradient communication overlaps the backward
#: pass and is inside ``backward``; under Horovod, the wait for the gradient averages is inside
#: ``optimizer``.
PHASES = ("data", "forward", "backward", "optimizer", "compute", "other")


def training_labels(run_id: str, hardware_profile: str, model: str) -> str:
    """The JSON train_model hands its ranks in :data:`LABELS_ENV` (names and ids only, never a secret)."""
    return json.dumps(
        {
            "run_id": _label(run_id),
            "component": "train_model",
            "hardware_profile": _label(hardware_profile),
            "model": _label(model),
        },
        sort_keys=True,
    )


# --- live training metrics ---------------------------------------------------------------------------


class TrainingCollector:
    """A rank's figures, built from the training context each time Prometheus scrapes.

    The counters and the step-time histogram fold the step records added since the last scrape
    (not the newest one, which the loop may still amend at an epoch end, until the run is over);
    the gauges read the context as it is.
    """

    def __init__(self, ctx: Any, labels: dict[str, str]) -> None:
        self.ctx = ctx
        self.names = list(LABEL_NAMES)
        self.values = [_label(labels.get(k)) for k in LABEL_NAMES]
        self.final = False
        self.started_unix = time.time()
        self.scrapes = 0
        self.first_scrape = self.last_scrape = 0.0
        self._lock = threading.Lock()
        self._seen = 0
        self._samples = 0.0
        self._steps = 0
        self._sum = 0.0
        self._buckets = [0] * len(STEP_BUCKETS)
        self._phases = dict.fromkeys(PHASES, 0.0)

    def _fold(self) -> None:
        records = self.ctx.step_records
        n = len(records) if self.final else max(len(records) - 1, self._seen)
        for rec in records[self._seen : n]:
            step_s = float(rec.get("step_s", 0.0))
            self._samples += rec.get("samples", 0)
            self._steps += 1
            self._sum += step_s
            for i, le in enumerate(STEP_BUCKETS):
                if step_s <= le:
                    self._buckets[i] += 1
            for phase in PHASES:
                v = rec.get(f"{phase}_s")
                if v is not None:
                    self._phases[phase] += float(v)
        self._seen = n

    def describe(self) -> Iterable[Any]:
        return []  # not known before the first collect: the registry must not call collect() at registration

    def collect(self) -> Iterable[Any]:
        with self._lock:
            self._fold()
            out: list[Any] = [self._info()]
            gauge = self._gauge_into(out)
            self._run_gauges(gauge)
            self._device_gauges(gauge)
            out += self._counters()
        self.last_scrape = time.monotonic()
        if not self.scrapes:
            self.first_scrape = self.last_scrape
        self.scrapes += 1
        return out

    def _gauge_into(self, out: list[Any]) -> Callable[..., None]:
        """A function that adds one gauge (with this rank's labels and ``extra``) to ``out``; None is skipped."""
        from prometheus_client.core import GaugeMetricFamily

        names, values = self.names, self.values

        def gauge(name: str, doc: str, value: float | None, extra: dict[str, str] | None = None) -> None:
            if value is None:
                return
            fam = GaugeMetricFamily(name, doc, labels=names + list(extra or {}))
            fam.add_metric(values + list((extra or {}).values()), float(value))
            out.append(fam)

        return gauge

    def _info(self) -> Any:
        """The run's settings as labels of a gauge of value 1."""
        from prometheus_client.core import GaugeMetricFamily

        ctx, s = self.ctx, self.ctx.settings
        info = GaugeMetricFamily(
            "trainpipe_training_info",
            "the run's settings (value 1)",
            labels=self.names + ["backend", "dist_backend", "precision", "world_size", "train_function"],
        )
        info.add_metric(
            self.values + [s.backend, str(ctx.dist_name), s.precision, str(ctx.world_size), _label(s.train_function)],
            1.0,
        )
        return info

    def _run_gauges(self, gauge: Callable[..., None]) -> None:
        """Where the run is: its step, epoch, progress, restarts, checkpoint, learning rate and logged values."""
        ctx = self.ctx
        s = ctx.settings
        gauge("trainpipe_training_global_step", "optimizer steps taken, resumed ones included", ctx.global_step)
        gauge(
            "trainpipe_training_epoch",
            "the epoch in progress, from 1 (0 before the first batch)",
            ctx.epoch + 1 if ctx.batches_done or ctx.global_step else 0,
        )
        gauge("trainpipe_training_epochs", "epochs the run is configured for", s.epochs)
        progress = ctx.progress_ratio()
        gauge("trainpipe_training_progress_ratio", "share of the run's batches done (0-1)", progress)
        gauge("trainpipe_training_eta_seconds", "estimated seconds left, from this process's rate", ctx.eta_seconds())
        gauge(
            "trainpipe_training_start_timestamp_seconds",
            "when this process started training (unix time)",
            self.started_unix,
        )
        gauge("trainpipe_training_restarts", "restarts of the worker group before this attempt", ctx.restarts)
        gauge(
            "trainpipe_training_last_checkpoint_timestamp_seconds",
            "when the newest checkpoint was started (unix time)",
            ctx.last_checkpoint_unix,
        )
        gauge(
            "trainpipe_training_learning_rate",
            "the optimizer's learning rate (its first parameter group)",
            ctx.learning_rate(),
        )
        for key, value in sorted(ctx.last_logged().items()):
            gauge(
                "trainpipe_training_logged",
                "the newest value the training function logged with ctx.log",
                value,
                {"key": key},
            )

    def _device_gauges(self, gauge: Callable[..., None]) -> None:
        """This rank's memory and, through NVML, its GPUs' utilization, memory and power."""
        ctx = self.ctx
        gauge(
            "trainpipe_training_peak_rss_bytes",
            "peak resident memory of this rank",
            resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024.0,
        )
        device = ctx.device_figures()
        gauge(
            "trainpipe_training_device_peak_memory_bytes",
            "peak accelerator memory allocated by this rank",
            device.get("peak_memory_bytes"),
        )
        for gpu in device.get("gpus", []):
            idx = {"gpu": str(gpu["index"])}
            gauge(
                "trainpipe_gpu_utilization_ratio",
                "NVML: share of time a kernel ran (0-1)",
                gpu.get("utilization"),
                idx,
            )
            gauge("trainpipe_gpu_memory_used_bytes", "NVML: device memory in use", gpu.get("memory_used"), idx)
            gauge("trainpipe_gpu_power_watts", "NVML: board power draw", gpu.get("power"), idx)

    def _counters(self) -> list[Any]:
        """The samples, batches and phase seconds this process counted, and its step-time histogram."""
        from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily

        names, values = self.names, self.values
        samples = CounterMetricFamily("trainpipe_training_samples", "samples this rank trained on", labels=names)
        samples.add_metric(values, self._samples)
        steps = CounterMetricFamily("trainpipe_training_batches", "batches this rank ran (this process)", labels=names)
        steps.add_metric(values, float(self._steps))
        phases = CounterMetricFamily(
            "trainpipe_training_phase_seconds", "seconds spent in each part of the step", labels=names + ["phase"]
        )
        for phase, secs in self._phases.items():
            if secs or phase in ("data", "other"):
                phases.add_metric(values + [phase], secs)
        hist = HistogramMetricFamily(
            "trainpipe_training_step_seconds", "wall time of a batch, data wait included", labels=names
        )
        cumulative = [(repr(le), float(c)) for le, c in zip(STEP_BUCKETS, self._buckets, strict=True)] + [
            ("+Inf", float(self._steps))
        ]
        hist.add_metric(values, cumulative, sum_value=self._sum)
        return [samples, steps, phases, hist]

    def interval(self) -> float | None:
        """The mean time between Prometheus's scrapes so far (None before the second)."""
        return (self.last_scrape - self.first_scrape) / (self.scrapes - 1) if self.scrapes > 1 else None


class _PeerCollector:
    """Local rank 0's view of its node's other ranks: their series, read over loopback at scrape
    time (a peer that does not answer within half a second is left out of that scrape)."""

    def __init__(self, urls: list[str]) -> None:
        self.urls = urls
        self.local = threading.local()

    def describe(self) -> Iterable[Any]:
        return []

    def collect(self) -> Iterable[Any]:
        if getattr(self.local, "self_only", False):
            return []
        import urllib.request

        from prometheus_client.parser import text_string_to_metric_families

        families: list[Any] = []
        for url in self.urls:
            try:
                with urllib.request.urlopen(url + "?ranks=self", timeout=0.5) as response:
                    text = response.read().decode("utf-8")
                families += list(text_string_to_metric_families(text))
            except Exception:  # noqa: BLE001 (a peer starting, restarting or gone)
                continue
        return families


def _merged(families: Iterable[Any]) -> list[Any]:
    """One family per name (a peer's samples join this rank's): an exposition names each once."""
    out: dict[str, Any] = {}
    for fam in families:
        if fam.name in out:
            out[fam.name].samples.extend(fam.samples)
        else:
            out[fam.name] = fam
    return list(out.values())


class _Node:
    """The registry a rank serves: its own collector, and its local peers' on local rank 0."""

    def __init__(self, own: TrainingCollector, peers: _PeerCollector | None) -> None:
        self.own, self.peers = own, peers

    def collect(self) -> Iterable[Any]:
        return _merged([*self.own.collect(), *(self.peers.collect() if self.peers is not None else [])])


def _app(node: _Node, peers: _PeerCollector | None) -> Any:
    from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        if environ.get("PATH_INFO", "/") not in ("/", "/metrics"):
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"not found: /metrics\n"]
        self_only = "ranks=self" in environ.get("QUERY_STRING", "")
        if peers is not None:
            peers.local.self_only = self_only
        body = generate_latest(node)  # type: ignore[arg-type]
        start_response("200 OK", [("Content-Type", CONTENT_TYPE_LATEST)])
        return [body]

    return app


def _serve(app: Any, address: str, port: int) -> Any:
    from socketserver import ThreadingMixIn
    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

    class Server(ThreadingMixIn, WSGIServer):
        daemon_threads = True
        allow_reuse_address = True

    class Quiet(WSGIRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base class's name)
            pass

    server = make_server(address, port, app, Server, handler_class=Quiet)
    threading.Thread(target=server.serve_forever, name="trainpipe-metrics", daemon=True).start()
    return server


class TrainingMetrics:
    """A rank's Prometheus endpoint: serve while training, wait for one last scrape at the end."""

    def __init__(self, collector: TrainingCollector, server: Any, port: int) -> None:
        self.collector, self._server, self.port = collector, server, port

    @classmethod
    def serve(cls, ctx: Any, port: int, local_index: int, local_world: int = 1) -> TrainingMetrics | None:
        """Serve ``ctx``'s figures on ``port + local_index`` (local rank 0: with its
        ``local_world - 1`` peers'); None, and one warning, if it cannot."""
        labels = {}
        try:
            labels = json.loads(os.environ.get(LABELS_ENV) or "{}")
        except ValueError:
            pass
        labels.setdefault("component", "train_model")
        labels.update(rank=str(ctx.rank), node=platform.node())
        collector = TrainingCollector(ctx, labels)
        address = os.environ.get(ADDRESS_ENV) or "0.0.0.0"
        where = port + local_index
        loopback = "127.0.0.1" if address in ("0.0.0.0", "", "::") else address
        peers = (
            _PeerCollector([f"http://{loopback}:{port + i}/metrics" for i in range(1, local_world)])
            if local_index == 0 and local_world > 1
            else None
        )
        try:
            server = _serve(_app(_Node(collector, peers), peers), address, where)
        except ImportError:
            warn("prometheus_client is not installed; this rank's metrics are not served")
            return None
        except OSError as exc:
            warn(
                f"metrics_port: cannot serve rank {ctx.rank}'s metrics on {address}:{where} ({exc.strerror or exc}); "
                "training goes on without them"
            )
            return None
        return cls(collector, server, where)

    def close(self, finished: bool) -> None:
        """Stop serving. A finished run that Prometheus has been scraping first waits (at most
        :data:`LINGER_ENV` seconds, and at most about two scrape intervals) for one more scrape,
        so the final step count reaches Prometheus."""
        c = self.collector
        c.final = True
        interval = c.interval()
        if finished and interval is not None:  # a Prometheus is scraping (two scrapes seen, not one curl)
            try:
                cap = float(os.environ.get(LINGER_ENV) or 30)
            except ValueError:
                cap = 30.0
            done_at = time.monotonic()
            deadline = done_at + min(cap, max(2.5 * interval, 1.0))
            while c.last_scrape < done_at and time.monotonic() < deadline:
                time.sleep(0.05)
        try:
            self._server.shutdown()
            self._server.server_close()
        except Exception:  # noqa: BLE001 (telemetry never fails a run)
            pass
