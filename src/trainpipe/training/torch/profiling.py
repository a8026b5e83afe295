"""What a torch rank measures beside its steps: a torch.profiler window on rank 0 (a Chrome
trace, FLOPs per step, collective time) and, on CUDA, NVML's utilization and memory sampled on a
thread. Imports torch.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from trainpipe.contract.layout import TELEMETRY_DIR

if TYPE_CHECKING:  # pragma: no cover
    from trainpipe.training.settings import TrainModelConfig

PROFILE_SKIP = 3  # steps before the profiler's warm-up step: the first steps are not steady


def _self_device_us(event: Any) -> float:
    """An op's own device time (µs): ``self_device_time_total`` (torch 2.4 on), ``self_cuda_time_total`` before."""
    return float(getattr(event, "self_device_time_total", getattr(event, "self_cuda_time_total", 0.0)) or 0.0)


class TorchProfile:
    """torch.profiler over a window of steps on rank 0: a Chrome trace, FLOPs and collective time."""

    def __init__(self, settings: TrainModelConfig, out: Path, device: torch.device) -> None:
        from torch.profiler import ProfilerActivity, profile, schedule

        self.active = settings.profile_steps
        self.first = PROFILE_SKIP + 1
        self.trace = out / TELEMETRY_DIR / "trace_rank0.json"
        self._complete = False
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        self.prof = profile(
            activities=activities,
            schedule=schedule(wait=PROFILE_SKIP, warmup=1, active=self.active, repeat=1),
            on_trace_ready=self._ready,
            with_flops=True,
        )
        self.prof.start()

    def _ready(self, prof: Any) -> None:
        # the window is over: its trace is written at finish(), after the loop, so that writing it
        # costs no training step its time (an export inside a step made that step 100x longer)
        self._complete = True

    def _collect(self) -> dict[str, Any]:
        self.trace.parent.mkdir(parents=True, exist_ok=True)
        self.prof.export_chrome_trace(str(self.trace))
        events = self.prof.key_averages()
        names = ("all_reduce", "allreduce", "gloo", "nccl", "broadcast", "reduce_scatter", "all_gather")
        collective = [e for e in events if any(k in e.key.lower() for k in names)]
        top = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:15]
        return {
            "trace": self.trace.name,
            "first_step_index": self.first,
            "steps": self.active,
            "flops_per_step": sum(int(e.flops or 0) for e in events) / self.active,
            "collective_ms_per_step": sum(e.cpu_time_total for e in collective) / 1000.0 / self.active,
            "top_ops": [
                {
                    "name": e.key,
                    "self_cpu_ms": e.self_cpu_time_total / 1000.0,
                    "self_device_ms": _self_device_us(e) / 1000.0,
                    "calls": int(e.count),
                }
                for e in top
            ],
        }

    def step(self) -> None:
        self.prof.step()

    def finish(self) -> dict[str, Any] | None:
        """The window's figures (None when the run ended before the window did)."""
        self.prof.stop()
        return self._collect() if self._complete else None


class NvmlSampler:
    """GPU utilization and memory of this rank's device through NVML, sampled every 0.5 s in a thread."""

    def __init__(self, device: torch.device) -> None:
        self.util: list[float] = []
        self.mem: list[float] = []
        self._stop = threading.Event()
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
            self._index = device.index or 0
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(self._index)
        except Exception:  # no NVML (driver, or nvidia-ml-py not installed): nothing to sample
            self._nvml = None
            return
        self._thread = threading.Thread(target=self._run, name="nvml-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            rates = self._nvml.nvmlDeviceGetUtilizationRates(self._handle)
            info = self._nvml.nvmlDeviceGetMemoryInfo(self._handle)
            self.util.append(float(rates.gpu))
            self.mem.append(info.used / 2**20)

    def now(self) -> dict[str, Any] | None:
        """This device's NVML readings now (utilization 0-1, memory in bytes, power in watts)."""
        if self._nvml is None:
            return None
        try:
            rates = self._nvml.nvmlDeviceGetUtilizationRates(self._handle)
            info = self._nvml.nvmlDeviceGetMemoryInfo(self._handle)
            try:
                power = self._nvml.nvmlDeviceGetPowerUsage(self._handle) / 1000.0
            except Exception:  # noqa: BLE001 (not every board reports power)
                power = None
            return {
                "index": self._index,
                "utilization": rates.gpu / 100.0,
                "memory_used": float(info.used),
                "power": power,
            }
        except Exception:  # noqa: BLE001 (telemetry never fails a run)
            return None

    def finish(self) -> dict[str, Any] | None:
        if self._nvml is None:
            return None
        self._stop.set()
        self._thread.join(timeout=2)
        if not self.util:
            return None
        return {
            "utilization_pct_mean": sum(self.util) / len(self.util),
            "memory_used_mb_max": max(self.mem),
            "samples": len(self.util),
        }
