"""The checkpoint manager without a framework (a state that is a dict of numbers), and the torch
stager's reused buffers."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from trainpipe.training.checkpoint import CheckpointManager, checkpoint_name, completed_checkpoints

pytestmark = pytest.mark.unit


class DictState:
    """A StateIO over a dict: staging copies it, the write (on the writer thread) dumps the copy."""

    staged_bytes = 0

    def __init__(self, state: dict, write_delay: float = 0.0, fail_write: bool = False) -> None:
        self.state, self.write_delay, self.fail_write = state, write_delay, fail_write
        self.writer_threads: list[str] = []

    def prepare(self) -> None:
        pass

    def stage(self, tmp: Path, step: int):
        staged = dict(self.state)

        def write() -> None:
            self.writer_threads.append(threading.current_thread().name)
            time.sleep(self.write_delay)
            if self.fail_write:
                raise OSError("No space left on device")
            (tmp / "state.json").write_text(json.dumps(staged))

        return write

    def load(self, path: Path) -> None:
        self.state.clear()
        self.state.update(json.loads((path / "state.json").read_text()))


def trainer(step: int) -> dict:
    return {"global_step": step, "batches_done": step, "history": []}


def test_a_checkpoint_is_written_in_the_background_renamed_whole_and_the_oldest_pruned(tmp_path):
    io = DictState({"w": 1.0})
    m = CheckpointManager(tmp_path, keep=2, every_steps=0, every_s=0, io=io, chief=True)
    for step in (10, 20, 30):
        io.state["w"] = float(step)
        m.save(step, trainer(step))
        io.state["w"] = -1.0  # training goes on: the staged copy is what is written
    m.wait()
    assert [p.name for p in completed_checkpoints(tmp_path)] == [checkpoint_name(20), checkpoint_name(30)]
    assert not list(tmp_path.glob(".ckpt-*.tmp"))
    assert json.loads((tmp_path / checkpoint_name(30) / "state.json").read_text()) == {"w": 30.0}
    assert io.writer_threads == ["trainpipe-checkpoint"] * 3  # never on the loop's thread
    assert m.saves == 3 and m.last_step == 30


def test_only_the_next_checkpoint_waits_for_a_write_in_flight_and_reports_the_wait(tmp_path):
    m = CheckpointManager(
        tmp_path, keep=5, every_steps=0, every_s=0, io=DictState({"w": 0}, write_delay=0.3), chief=True
    )
    t = time.perf_counter()
    m.save(1, trainer(1))
    returned = time.perf_counter() - t
    assert returned < 0.2  # the loop goes on while the write runs
    m.save(2, trainer(2))  # waits for the first write
    m.wait()
    f = m.figures()
    assert f["saved"] == 2 and f["recent"]["wait_s"][0] < 0.1 and 0.15 < f["recent"]["wait_s"][1] < 1.0
    assert len(f["recent"]["write_s"]) == 2 and min(f["recent"]["write_s"]) >= 0.3
    assert f["totals"]["stall_s"] < 0.2


def test_a_failed_write_is_raised_on_the_loops_thread_and_leaves_no_completed_checkpoint(tmp_path):
    m = CheckpointManager(
        tmp_path, keep=2, every_steps=0, every_s=0, io=DictState({"w": 0}, fail_write=True), chief=True
    )
    m.save(5, trainer(5))
    with pytest.raises(OSError, match="No space left"):
        m.wait()
    assert completed_checkpoints(tmp_path) == []
    m.wait()  # raised once


def test_resume_skips_a_torn_newest_checkpoint_and_removes_stale_writes(tmp_path, capsys):
    io = DictState({"w": 0.0})
    m = CheckpointManager(tmp_path, keep=5, every_steps=0, every_s=0, io=io, chief=True)
    for step in (1, 2):
        io.state["w"] = float(step)
        m.save(step, trainer(step))
    m.wait()
    (tmp_path / checkpoint_name(2) / "state.json").write_text("{torn")
    (tmp_path / ".ckpt-0000000003.tmp").mkdir()
    fresh = CheckpointManager(tmp_path, keep=5, every_steps=0, every_s=0, io=io, chief=True)
    fresh.remove_stale()
    assert not (tmp_path / ".ckpt-0000000003.tmp").exists()
    got = fresh.load_newest()
    assert got["global_step"] == 1 and io.state == {"w": 1.0} and fresh.last_step == 1
    assert "skipping unreadable checkpoint ckpt-0000000002" in capsys.readouterr().err


def test_cadence_by_steps_and_by_time(tmp_path, monkeypatch):
    """On a clock the test moves, so a loaded machine cannot make the interval pass early."""
    from types import SimpleNamespace

    from trainpipe.training import checkpoint as checkpoint_mod

    now = [1000.0]
    clock = SimpleNamespace(monotonic=lambda: now[0], perf_counter=time.perf_counter, time=time.time, sleep=time.sleep)
    monkeypatch.setattr(checkpoint_mod, "time", clock)
    m = CheckpointManager(tmp_path, keep=2, every_steps=10, every_s=0.2, io=DictState({}), chief=True)
    assert [s for s in range(1, 31) if m.steps_due(s)] == [10, 20, 30]
    m.start_clock()
    now[0] += 0.19
    assert not m.time_due()
    now[0] += 0.01
    assert m.time_due()
    m.save(7, trainer(7))  # a checkpoint restarts the clock, and step 7 is not due again
    m.wait()
    assert not m.time_due() and not m.steps_due(7)
    off = CheckpointManager(tmp_path, keep=2, every_steps=0, every_s=0, io=DictState({}), chief=True)
    assert not off.steps_due(10) and not off.time_due()


def test_the_torch_stager_reuses_its_buffers_and_holds_the_state_as_it_was():
    import torch

    from trainpipe.training.torch.state import Stager

    model = torch.nn.Linear(4, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    stager = Stager(torch.device("cpu"))
    state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": 3}
    stager.allocate(state)
    ptr = {id(t): t.data_ptr() for t in stager._buffers.values()}
    staged = stager.copy(state)
    before = staged["model"]["weight"].clone()
    with torch.no_grad():
        model.weight.add_(1.0)  # the next step changes the live weights ...
    assert torch.equal(staged["model"]["weight"], before)  # ... not the staged copy
    again = stager.copy({"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": 3})
    assert {id(t): t.data_ptr() for t in stager._buffers.values()} == ptr  # the same buffers, no new allocation
    assert torch.equal(again["model"]["weight"], model.weight.detach())
    assert again["epoch"] == 3 and again["optimizer"]["param_groups"][0]["lr"] == 0.1
    assert stager.nbytes == sum(t.numel() * t.element_size() for t in stager._buffers.values()) > 0


@pytest.mark.parametrize("refused", [None, "no O_DIRECT", "writes refused"])
def test_a_direct_file_holds_exactly_the_bytes_written_whatever_their_alignment(tmp_path, monkeypatch, refused):
    """O_DIRECT where the file system takes it; through the page cache where the platform has no
    O_DIRECT, or the file system opens the file but refuses its writes (EINVAL, as some FUSE mounts)."""
    import errno
    import os

    from trainpipe.training import direct_io

    if refused == "no O_DIRECT":
        monkeypatch.delattr(direct_io.os, "O_DIRECT")
    elif refused == "writes refused":
        real, calls = os.write, []

        def write(fd, data):
            calls.append(fd)
            if len(calls) == 1:
                raise OSError(errno.EINVAL, "Invalid argument")
            return real(fd, data)

        monkeypatch.setattr(direct_io.os, "write", write)
    rng = __import__("random").Random(7)
    chunks = [os.urandom(n) for n in (1, 4095, 4097, direct_io.CHUNK + 13, 100, 3)]
    chunks.insert(3, bytes(memoryview(os.urandom(64)).toreadonly()))  # a read-only view, as torch.save passes
    rng.shuffle(chunks)
    f = direct_io.DirectFile(tmp_path / "x.distcp")
    try:
        for c in chunks:
            assert f.write(memoryview(c).toreadonly()) == len(c)
        assert f.tell() == sum(map(len, chunks))
        f.finish()
        assert f.direct is (refused is None)
    finally:
        f.release()
    assert (tmp_path / "x.distcp").read_bytes() == b"".join(chunks)
