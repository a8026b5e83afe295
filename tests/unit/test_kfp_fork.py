"""The KFP body's fork of its step ends as an interpreter would: a step that leaves a thread pool behind (Feast's
retrieval does) or exits with its own code, while another thread still works, ends with that code and says its
result; nothing of the body's own code runs after it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

STEP = """
import concurrent.futures, sys, threading, time
from trainpipe.contract.entrypoint import exit_now

pool = concurrent.futures.ThreadPoolExecutor(2)  # an idle worker left alive, as a library's pool is
pool.submit(lambda: None).result()
done = []
worker = threading.Thread(target=lambda: (time.sleep(0.2), done.append(1), print("worker done", file=sys.stderr)))
worker.start()
print('{"said": "%s"}' % " ".join(sys.argv[1:]))
sys.stdout.flush()
exit_now(int(sys.argv[-1]))
"""

BODY = """
import sys
sys.path.insert(0, sys.argv[1])
from trainpipe.faces.kfp_runtime import _forked
code, out = _forked("fake_step", ["--x", sys.argv[2]])
print("body got", code, out.strip())
"""


@pytest.mark.parametrize("code", ["0", "3"])
def test_a_forked_step_with_a_thread_pool_and_a_working_thread_ends_with_its_own_code(tmp_path: Path, code: str):
    (tmp_path / "fake_step.py").write_text(STEP)
    proc = subprocess.run(
        [sys.executable, "-c", BODY, str(tmp_path), code], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [f'body got {code} {{"said": "--x {code}"}}'], proc.stdout
    assert "worker done" in proc.stderr  # the step's thread finished before the step ended
