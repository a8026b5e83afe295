"""Progress with rate and ETA in the task log (or a bar on a terminal): the training loop, the dataset
hash and validate_data report through it. Stdlib at import; rich only to draw a bar on a terminal."""

from __future__ import annotations

import os
import sys
import time
from typing import Any

#: Seconds between two progress lines in the task log (default 10).
PROGRESS_ENV = "TRAINPIPE_PROGRESS_EVERY_S"


def _clock(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    h, rest = divmod(seconds, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}" if h else f"{rest // 60}:{rest % 60:02d}"


class Progress:
    """Progress with rate and ETA: a line every ``every_s`` seconds in the task log, or a rich bar
    on a terminal. :meth:`update` is cheap enough to call every step (one clock read).

    Args:
        what: Who reports (the line's prefix: ``train_model``).
        total: The units of the whole job.
        unit: What one unit is (``batches``, ``files``, ``MB``).
        start: Units already done before this process (a resumed run).
        rate_unit: The rate's unit and how many of it a unit is (``("samples", 64)``).
    """

    def __init__(
        self,
        what: str,
        total: float,
        unit: str,
        *,
        start: float = 0.0,
        rate_unit: tuple[str, float] | None = None,
        every_s: float | None = None,
        stream: Any = None,
        show: bool = True,
    ) -> None:
        self.what, self.total, self.unit = what, float(total), unit
        self.rate_name, self.rate_scale = rate_unit or (unit, 1.0)
        self.stream = stream or sys.stderr
        try:
            self.every = float(every_s if every_s is not None else os.environ.get(PROGRESS_ENV) or 10.0)
        except ValueError:
            self.every = 10.0
        if not show:
            self.every = float("inf")
        self.start_units = self.done = float(start)
        self.t0 = time.perf_counter()
        self._next = self.t0 + self.every
        self._bar: Any = None
        isatty = getattr(self.stream, "isatty", None)
        if show and isatty is not None and isatty() and self.total > 0:
            try:
                from rich.console import Console
                from rich.progress import (
                    BarColumn,
                    TaskProgressColumn,
                    TextColumn,
                    TimeRemainingColumn,
                )
                from rich.progress import (
                    Progress as RichProgress,
                )

                self._bar = RichProgress(
                    TextColumn(what),
                    BarColumn(),
                    TaskProgressColumn(),
                    TextColumn("{task.fields[rate]}"),
                    TimeRemainingColumn(),
                    console=Console(file=self.stream),
                    transient=False,
                )
                self._task = self._bar.add_task(what, total=self.total, completed=self.done, rate="")
                self._bar.start()
                self.every = min(self.every, 0.25)
                self._next = self.t0
            except Exception:  # noqa: BLE001 (no rich: plain lines)
                self._bar = None

    def rate(self) -> float:
        """Units per second since this process started."""
        elapsed = time.perf_counter() - self.t0
        return (self.done - self.start_units) / elapsed if elapsed > 0 else 0.0

    def eta(self) -> float | None:
        """Seconds left at the current rate (None before any progress)."""
        r = self.rate()
        return (self.total - self.done) / r if r > 0 and self.total > 0 else None

    def update(self, done: float) -> None:
        self.done = float(done)
        now = time.perf_counter()
        if now >= self._next:
            self._next = now + self.every
            self._show(now)

    def _line(self, now: float) -> str:
        pct = f" ({100.0 * self.done / self.total:.0f}%)" if self.total > 0 else ""
        total = f"/{self.total:,.0f}" if self.total > 0 else ""
        rate = self.rate() * self.rate_scale
        eta = self.eta()
        return (
            f"{self.what}: {self.done:,.0f}{total} {self.unit}{pct}, {rate:,.1f} {self.rate_name}/s, "
            f"elapsed {_clock(now - self.t0)}" + (f", ETA {_clock(eta)}" if eta is not None else "")
        )

    def _show(self, now: float) -> None:
        if self._bar is not None:
            self._bar.update(
                self._task, completed=self.done, rate=f"{self.rate() * self.rate_scale:,.1f} {self.rate_name}/s"
            )
            return
        print(self._line(now), file=self.stream, flush=True)

    def finish(self) -> None:
        """The last line (or the bar completed)."""
        if self._bar is not None:
            self._show(time.perf_counter())
            self._bar.stop()
            return
        if self.done > self.start_units and time.perf_counter() - self.t0 >= self.every:
            self._show(time.perf_counter())
