"""The warm host: a step it forks is the process ``python -m`` would have started (its arguments, folder,
environment, descriptors, session, command line, exit), dies with whoever asked for it, and the host outlives a
stopped run until its steps have ended. Each test starts a real host (nothing preloaded: these are its mechanics;
the reference pipeline's runs use it with its libraries)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainpipe.contract import warm

pytestmark = pytest.mark.unit

PROBE = """
import json, os, sys
fd = int(os.environ.get("PROBE_FD", "-1"))
if fd >= 0:
    os.write(fd, b"through the descriptor")
line = sys.stdin.readline() if os.environ.get("PROBE_STDIN") else ""
with open(f"/proc/{os.getpid()}/cmdline", "rb") as fh:
    cmdline = [c.decode(errors="surrogateescape") for c in fh.read().rstrip(b"\\0").split(b"\\0")]
print(json.dumps({"argv": sys.argv[1:], "cwd": os.getcwd(), "path0": sys.path[0], "name": __name__,
                  "env": {k: v for k, v in os.environ.items() if k.startswith("PROBE_")}, "stdin": line,
                  "cmdline": cmdline, "session": os.getsid(0) == os.getpid(), "umask": os.umask(0o22)}))
sys.stderr.write("to stderr\\n")
sys.exit(int(os.environ.get("PROBE_EXIT", "0")))
"""


def _until(check, what: str, within: float = 30.0):
    deadline = time.monotonic() + within
    while not (found := check()):
        assert time.monotonic() < deadline, f"not seen within {within} s: {what}"
        time.sleep(0.02)
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.fixture(scope="module")
def modules(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("modules")
    (folder / "probe_warm.py").write_text(PROBE)
    (folder / "ending_warm.py").write_text(
        "import atexit, sys, threading\n"
        "atexit.register(lambda: print('atexit ran', flush=True))\n"
        "threading.Thread(target=lambda: print('thread joined', flush=True)).start()\n"
        "if sys.argv[1:] == ['raise']:\n"
        "    raise RuntimeError('an uncaught error')\n"
    )
    (folder / "waiting_warm.py").write_text(
        "import os, signal, sys, time\n"
        "from pathlib import Path\n"
        "out = Path(sys.argv[1])\n"
        "if len(sys.argv) > 2:\n"
        "    signal.signal(signal.SIGTERM, lambda *_: (out / 'terminated').write_text('yes'))\n"
        "(out / 'pid.tmp').write_text(str(os.getpid())); (out / 'pid.tmp').rename(out / 'pid')\n"
        "while not (out / 'go').exists():\n"
        "    time.sleep(0.02)\n"
    )
    return folder


@pytest.fixture(scope="module")
def host(modules):
    before = {k: os.environ.get(k) for k in (warm.PRELOAD_ENV, warm.HOST_ENV)}
    os.environ[warm.PRELOAD_ENV] = ""
    proc, path = warm.start()
    os.environ[warm.HOST_ENV] = path
    yield proc
    warm.stop(proc)
    for key, value in before.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def _both(modules: Path, args: list[str], env: dict[str, str], **kw) -> tuple[dict, dict]:
    """The probe's report as ``python -m`` and as forked by the host, with the same settings."""
    cmd = [sys.executable, "-m", "probe_warm", *args]
    fresh = subprocess.run(cmd, cwd=modules, env=env, capture_output=True, text=True, check=False, **kw)
    forked = warm.spawn(cmd, env, stdout=True, stderr=True, text=True, cwd=str(modules))
    assert forked is not None, "the host refused a request it can serve"
    out, err = forked.stdout.read(), forked.stderr.read()
    assert (forked.wait(), err) == (fresh.returncode, fresh.stderr)
    return json.loads(fresh.stdout), json.loads(out)


def test_a_forked_step_is_what_python_m_would_have_started(host, modules):
    env = {**os.environ, "PROBE_A": "1", "PROBE_EXIT": "3"}
    fresh, forked = _both(modules, ["--flag", "value with spaces"], env)
    assert forked == fresh
    assert fresh["argv"] == ["--flag", "value with spaces"] and fresh["name"] == "__main__"
    assert fresh["path0"] == str(modules) and fresh["cmdline"][1:3] == ["-m", "probe_warm"]


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    args=st.lists(st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\0"), max_size=12), max_size=4),
    values=st.dictionaries(
        st.from_regex(r"PROBE_[A-Z]{1,6}", fullmatch=True).filter(lambda k: k not in ("PROBE_FD", "PROBE_EXIT")),
        st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\0"), max_size=12),
        max_size=3,
    ),
)
def test_any_arguments_and_environment_reach_the_step_unchanged(host, modules, args, values):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROBE_")}
    fresh, forked = _both(modules, args, {**env, **values})
    assert forked == fresh
    assert (forked["argv"], forked["env"]) == (args, values)


def test_descriptors_stdin_and_a_session_of_its_own(host, modules, tmp_path):
    with tempfile.TemporaryFile() as record, open(tmp_path / "in.txt", "w+") as stdin:
        stdin.write("a line in\n")
        stdin.flush()
        stdin.seek(0)
        saved = os.dup(0)
        os.dup2(stdin.fileno(), 0)
        try:
            env = {**os.environ, "PROBE_FD": str(record.fileno()), "PROBE_STDIN": "1"}
            cmd = [sys.executable, "-m", "probe_warm"]
            step = warm.spawn(
                cmd, env, stdout=True, text=True, pass_fds=(record.fileno(),), start_new_session=True, cwd=str(modules)
            )
        finally:
            os.dup2(saved, 0)
            os.close(saved)
        assert step is not None
        report = json.loads(step.stdout.read())
        assert step.wait() == 0
        record.seek(0)
        assert record.read() == b"through the descriptor"
    assert (report["stdin"], report["session"]) == ("a line in\n", True)


def test_it_ends_as_an_interpreter_ends(host, modules):
    cmd = [sys.executable, "-m", "ending_warm"]
    step = warm.spawn(cmd, dict(os.environ), stdout=True, stderr=True, text=True, cwd=str(modules))
    assert step is not None
    assert (step.stdout.read(), step.wait()) == ("thread joined\natexit ran\n", 0)
    step = warm.spawn([*cmd, "raise"], dict(os.environ), stdout=True, stderr=True, text=True, cwd=str(modules))
    assert step is not None
    err = step.stderr.read()
    assert step.wait() == 1
    assert "Traceback" in err and "RuntimeError: an uncaught error" in err


def test_wait_times_out_and_a_signal_ends_the_step(host, modules, tmp_path):
    step = warm.spawn([sys.executable, "-m", "waiting_warm", str(tmp_path)], dict(os.environ), cwd=str(modules))
    assert step is not None
    _until(lambda: (tmp_path / "pid").exists(), "the step started")
    assert int((tmp_path / "pid").read_text()) == step.pid and step.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        step.wait(timeout=0.05)
    step.kill()
    assert step.wait() == -signal.SIGKILL


def test_a_step_gets_its_lifeline_signal_when_whoever_asked_for_it_dies(host, modules, tmp_path):
    asker = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import os, sys, time\nfrom trainpipe.contract import warm\n"
            f"step = warm.spawn([sys.executable, '-m', 'waiting_warm', {str(tmp_path)!r}, 'trap'], dict(os.environ), "
            f"cwd={str(modules)!r})\nassert step is not None\nstep.wait()",
        ]
    )
    pid = int(_until(lambda: (tmp_path / "pid").exists() and (tmp_path / "pid").read_text(), "the step started"))
    asker.kill()
    asker.wait()
    _until(lambda: (tmp_path / "terminated").exists(), "the step's SIGTERM, once its asker died")
    (tmp_path / "go").write_text("")
    _until(lambda: not _alive(pid), "the step ended")


def test_the_host_stays_through_a_stop_until_its_steps_have_ended(modules, tmp_path):
    """A stopped run signals every process of it; the host ignores that, and when the engine's process that
    started it dies, it serves no one new and ends once the steps it forked have ended."""
    engine = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import os, sys\nfrom trainpipe.contract import warm\n"
            f"os.environ[warm.PRELOAD_ENV] = ''\nproc, path = warm.start()\nos.environ[warm.HOST_ENV] = path\n"
            f"step = warm.spawn([sys.executable, '-m', 'waiting_warm', {str(tmp_path)!r}, 'trap'], dict(os.environ), "
            f"cwd={str(modules)!r})\nassert step is not None\nprint(proc.pid, flush=True)\nsys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    host_pid = int(engine.stdout.readline())
    step_pid = int(_until(lambda: (tmp_path / "pid").exists() and (tmp_path / "pid").read_text(), "the step started"))
    os.kill(host_pid, signal.SIGTERM)
    os.kill(step_pid, signal.SIGTERM)
    _until(lambda: (tmp_path / "terminated").exists(), "the step's own SIGTERM")
    engine.kill()  # the engine's process dies: the host is orphaned, its step still runs
    engine.wait()
    assert _alive(host_pid) and _alive(step_pid)
    (tmp_path / "go").write_text("")
    _until(lambda: not _alive(step_pid), "the step ended")
    _until(lambda: not _alive(host_pid), "the host ended after its last step")


def test_what_it_cannot_serve_is_started_as_before(host, modules):
    cmd = [sys.executable, "-m", "probe_warm"]
    assert warm.spawn(cmd, {**os.environ, "PYTHONHASHSEED": "123"}) is None  # another interpreter's settings
    assert warm.spawn([sys.executable, str(modules / "probe_warm.py")], dict(os.environ)) is None  # not -m
    assert warm.spawn(["/usr/bin/python3.11", "-m", "probe_warm"], dict(os.environ)) is None  # another interpreter
    gone = {**os.environ, warm.HOST_ENV: "@trainpipe-warm-no-such-host"}
    assert warm.spawn(cmd, gone) is None
    no_host = {k: v for k, v in os.environ.items() if k != warm.HOST_ENV}
    saved = os.environ.pop(warm.HOST_ENV)
    try:
        assert warm.spawn(cmd, no_host) is None
    finally:
        os.environ[warm.HOST_ENV] = saved


def test_a_dry_run_starts_no_host(monkeypatch):
    from trainpipe.app import runner
    from trainpipe.contract import dry

    assert runner.DRY_RUN_ENV == dry.ENV
    monkeypatch.setenv(dry.ENV, "/tmp/dry")
    assert runner._warm_host() is None
    monkeypatch.delenv(dry.ENV)
    monkeypatch.setenv(warm.HOST_ENV, "off")
    assert runner._warm_host() is None


def test_a_host_that_loaded_cudas_driver_serves_no_one(monkeypatch):
    """A process forked after ``cuInit`` cannot use the GPU: the host refuses, and the step starts as before."""
    from trainpipe.contract.warm import Host

    host = Host.__new__(Host)
    host.orphaned, host.python = False, {"PYTHONX": "1"}
    # this test's process may hold threads (pytest's, other tests'): a host would refuse for that too
    assert "CUDA" not in host._refusal({"python": {"PYTHONX": "1"}})
    monkeypatch.setattr(warm, "_cuda_driver_loaded", lambda: True)
    assert "CUDA" in host._refusal({"python": {"PYTHONX": "1"}})


def test_the_umask_is_the_askers(host, modules):
    """A step sets umask 027 (docs/security.md); the ranks it asks for write their files with it, as its children
    would."""
    before = os.umask(0o027)
    try:
        fresh, forked = _both(modules, [], dict(os.environ))
    finally:
        os.umask(before)
    assert forked["umask"] == fresh["umask"] == 0o027


def test_what_a_forked_process_used_is_counted_by_whoever_asked(host, modules, tmp_path):
    """CPU time and peak memory of a rank the host forked count for the launcher that asked for it, running
    (psutil) and once ended (as ``RUSAGE_CHILDREN`` counts a child's): a training's cost and its max_cost."""
    from trainpipe.services.costs import Meter

    burn = modules / "burn_warm.py"
    burn.write_text(
        "import sys, time\nfrom pathlib import Path\nout = Path(sys.argv[1])\nend = time.process_time() + 0.3\n"
        "while time.process_time() < end:\n    pass\n(out / 'burnt').write_text('')\n"
        "while not (out / 'go').exists():\n    time.sleep(0.01)\n"
    )
    meter = Meter()
    step = warm.spawn([sys.executable, "-m", "burn_warm", str(tmp_path)], dict(os.environ), cwd=str(modules))
    assert step is not None and warm.forked_running() == [step.pid]
    _until(lambda: (tmp_path / "burnt").exists(), "the step burnt its CPU")
    assert meter.live().cpu_core_seconds >= 0.3
    (tmp_path / "go").write_text("")
    assert step.wait() == 0 and warm.forked_running() == []
    usage = meter.usage()
    assert usage.cpu_core_seconds >= 0.3 and usage.peak_memory_mb > 0


@given(st.lists(st.from_regex(r"[a-z_][a-z0-9_.]{0,12}", fullmatch=True), max_size=4), st.booleans())
def test_the_preload_list_replaces_or_adds_to_the_default(names, add):
    text = ("+" if add else "") + " , ".join(names)
    assert warm.preload_list(text) == (warm.PRELOAD if add else ()) + tuple(names)
    assert warm.preload_list(None) == warm.PRELOAD
