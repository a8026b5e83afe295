"""A warm host for the steps of one ``trainpipe run``: one process imports the libraries the steps need (MLflow,
torch, scikit-learn, matplotlib) once, and forks each step's entrypoint and each training rank from itself,
instead of each starting a fresh interpreter that imports them again. Stdlib only.

Python's ``multiprocessing`` forkserver, Gunicorn's ``--preload`` and Android's zygote do the same. The host
is started by the local engines' process (:mod:`trainpipe.app.runner`) beside the engine, and imports on the
second core while the engine starts; a step asks it through a Unix socket (:data:`HOST_ENV`), handing over its
standard streams and the descriptors it passes (:func:`socket.send_fds`). A forked step is what
``python -m <module> args`` in its working folder with its environment would be: its ``sys.argv``,
``sys.path[0]``, environment, descriptors, session and ``/proc/PID/cmdline`` are the ones it asked for, and it
ends as an interpreter ends (non-daemon threads joined, ``atexit`` run, streams flushed).

Whoever asked stays its parent in all but name: the host reports the step's exit status to it, and when the
asker dies (its socket closes) the host sends the step the signal a lifeline would have
(:mod:`~trainpipe.contract.lifeline`); a step dies with the host too. Where there is no host, or it cannot
serve this request (another interpreter, other ``PYTHON*`` settings, a thread alive in the host), the asker
starts the process as before: :func:`spawn` returns None.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import struct
import sys
from typing import Any

from trainpipe.contract.imports import import_module
from trainpipe.contract.lifeline import PARENT_ENV, STOP_SIGNALS

#: The host's socket, for every process of the run (the engine's tasks, a step's launcher).
HOST_ENV = "TRAINPIPE_WARM_HOST"
#: Set in a forked step: the descriptor of its asker's connection (closed: the asker died).
ASKER_FD_ENV = "TRAINPIPE_WARM_ASKER_FD"
#: What the host imports, in the order the reference pipeline's steps first need them.
PRELOAD = (
    "trainpipe.contract.entrypoint",
    "pandas",
    "mlflow",
    "mlflow.store.tracking.sqlalchemy_store",
    "torch",
    "torch._dynamo",
    "torch.nn.parallel",
    "sklearn.metrics",
    "matplotlib.pyplot",
)
#: Another list for a run (comma-separated modules; empty: none; ``+mod,...``: the default and these).
PRELOAD_ENV = "TRAINPIPE_WARM_PRELOAD"


def preload_list(wanted: str | None) -> tuple[str, ...]:
    """What the host imports: :data:`PRELOAD`, or the modules :data:`PRELOAD_ENV` names (comma-separated; empty:
    none), added to :data:`PRELOAD` when the list starts with ``+``."""
    if wanted is None:
        return PRELOAD
    names = tuple(m.strip() for m in wanted.lstrip().removeprefix("+").split(",") if m.strip())
    return PRELOAD + names if wanted.lstrip().startswith("+") else names


#: Bytes of the host's command line kept for each step's own (``/proc/PID/cmdline``, what ``ps`` shows).
TITLE_ROOM = 4096

#: What the host gets when the engine's process dies: it stays until the steps it forked have ended.
ORPHANED = signal.SIGUSR1

_HEADER = struct.Struct("!I")
_MAX_FDS = 64


def spawn(
    cmd: list[str],
    env: dict[str, str],
    *,
    stdout: bool = False,
    stderr: bool = False,
    text: bool = False,
    pass_fds: tuple[int, ...] = (),
    start_new_session: bool = False,
    deathsig: int = signal.SIGTERM,
    cwd: str | None = None,
) -> Forked | None:
    """``python -m <module> args`` (``cmd``) forked by the run's warm host, or None where none can serve it.

    ``stdout``/``stderr`` True: a pipe to read, as ``subprocess.PIPE``; else this process's own. ``deathsig``:
    what the step gets when this process dies."""
    path = env.get(HOST_ENV) or os.environ.get(HOST_ENV)
    if (
        not path
        or path == "off"
        or len(cmd) < 3
        or cmd[1] != "-m"
        or os.path.realpath(cmd[0]) != os.path.realpath(sys.executable)
    ):
        return None
    try:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(_address(path))
    except OSError:
        return None
    pipes: dict[int, int] = {}
    ends: dict[int, int] = {}
    for fd, wanted in ((1, stdout), (2, stderr)):
        if wanted:
            pipes[fd], ends[fd] = os.pipe()
    targets = [fd for fd in (0, 1, 2) if fd in ends or _is_open(fd)] + [fd for fd in pass_fds if fd > 2]
    sent = [ends.get(fd, fd) for fd in targets]
    request = {
        "argv": cmd[2:],
        "env": env,
        "cwd": cwd or os.getcwd(),
        "fds": targets,
        "session": start_new_session,
        "deathsig": int(deathsig),
        "umask": _umask(),
        "python": _python_settings(env),
    }
    body = json.dumps(request).encode()
    try:
        socket.send_fds(conn, [_HEADER.pack(len(body))], sent)
        conn.sendall(body)
        reply = _read_line(conn)
    except OSError:
        reply = None
    finally:
        for w in ends.values():
            os.close(w)
    if not reply or "pid" not in reply:
        conn.close()
        for r in pipes.values():
            os.close(r)
        return None
    streams: dict[int, Any] = {fd: open(r, "r" if text else "rb") for fd, r in pipes.items()}  # noqa: SIM115
    return Forked(int(reply["pid"]), conn, streams.get(1), streams.get(2))


class Forked:
    """The part of :class:`subprocess.Popen` the faces and the launcher use, for a step the host forked."""

    def __init__(self, pid: int, conn: socket.socket, stdout: Any, stderr: Any) -> None:
        self.pid, self._conn, self.stdout, self.stderr = pid, conn, stdout, stderr
        _LIVE.add(pid)
        self.stdin = None
        self.returncode: int | None = None
        self.args: list[str] = []

    def poll(self) -> int | None:
        if self.returncode is None:
            self._collect(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        import subprocess

        if self.returncode is None and not self._collect(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        assert self.returncode is not None
        return self.returncode

    def _collect(self, timeout: float | None) -> bool:
        ready, _, _ = select.select([self._conn], [], [], timeout)
        if not ready:
            return False
        reply = _read_line(self._conn)
        # a host that died took the step with it (its lifeline): as killed
        self.returncode = int(reply["code"]) if reply and "code" in reply else -signal.SIGKILL
        self._conn.close()
        _LIVE.discard(self.pid)
        if reply:
            _ENDED["cpu"] += float(reply.get("cpu", 0.0))
            _ENDED["maxrss_kb"] = max(_ENDED["maxrss_kb"], int(reply.get("maxrss_kb", 0)))
        return True

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


#: What this process asked the host for and has not collected yet (its ranks, running).
_LIVE: set[int] = set()
#: What the processes this process asked for used, once ended: CPU seconds, peak RSS.
_ENDED: dict[str, Any] = {"cpu": 0.0, "maxrss_kb": 0}


def forked_running() -> list[int]:
    """The processes the host forked for this one that are still running (a meter reads their CPU time)."""
    return sorted(_LIVE)


def forked_ended() -> tuple[float, int]:
    """What the processes the host forked for this one used, once they ended and were waited for: CPU seconds
    (theirs and their children's) and the largest peak RSS in kilobytes, as ``RUSAGE_CHILDREN`` counts a child's."""
    return float(_ENDED["cpu"]), int(_ENDED["maxrss_kb"])


def asker_gone() -> bool:
    """In a forked step: whether the process that asked for it died (nobody reads its output now)."""
    owner, _, fd = os.environ.get(ASKER_FD_ENV, "").partition(":")
    if not fd or owner != str(os.getpid()):  # a process the step started in turn inherited the variable
        return False
    try:
        ready, _, _ = select.select([int(fd)], [], [], 0)
        return bool(ready) and os.read(int(fd), 1) == b""
    except (OSError, ValueError):
        return True


def _address(path: str) -> str:
    """``@name``: a socket in Linux's abstract namespace (no file to leave behind when the host is killed)."""
    return "\0" + path[1:] if path.startswith("@") else path


def _umask() -> int | None:
    """This process's umask, without setting it (``os.umask`` would, for a moment, for every thread)."""
    try:
        with open("/proc/self/status", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return None


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def _read_line(conn: socket.socket) -> dict[str, Any] | None:
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(4096)
        if not chunk:
            return None
        data += chunk
    return json.loads(data)


def _python_settings(env: dict[str, str]) -> dict[str, str]:
    """What makes one interpreter's start differ from another's: a forked step must match the host's."""
    return {k: v for k, v in env.items() if k.startswith("PYTHON")}


# --- the host ------------------------------------------------------------------------------------------------------


class Host:
    """Serves forks between its imports, one module at a time, in one thread (a fork copies only the
    calling thread: a lock another thread held would stay held in the step forever)."""

    def __init__(self, listener: socket.socket, preload: tuple[str, ...]) -> None:
        self.listener, self.todo = listener, list(preload)
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        # a stopped run's processes are each signalled (lifeline.supervise): the steps checkpoint, the host that
        # is their parent stays until they have ended; its own parent's death comes as ORPHANED
        for sig in (*STOP_SIGNALS, ORPHANED):
            signal.signal(sig, self._signalled)
        #: connection → (pid, the signal it gets when its asker dies)
        self.steps: dict[socket.socket, tuple[int, int]] = {}
        #: every forked process not reaped yet (one whose asker died has no connection left)
        self.alive: set[int] = set()
        self.orphaned = False
        self.python = _python_settings(dict(os.environ))

    def _signalled(self, signum: int, _frame: Any) -> None:
        if signum == ORPHANED:
            self.orphaned = True

    def serve(self) -> None:
        """Until the engine's process is gone and every step forked has ended."""
        while not (self.orphaned and not self.alive):
            watched: list[Any] = [self.listener, self.wake_r, *self.steps]
            ready, _, _ = select.select(watched, [], [], 0 if self.todo else None)
            for item in ready:
                if item is self.listener:
                    self._accept()
                elif item == self.wake_r:
                    with contextlib.suppress(BlockingIOError, InterruptedError):
                        os.read(self.wake_r, 4096)
                    self._reap()
                elif item in self.steps:
                    self._asker_gone(item)
            if not ready and self.todo and not self.orphaned:
                module = self.todo.pop(0)
                try:
                    import_module(module)
                except Exception as exc:  # noqa: BLE001 (a library this environment lacks: its steps import it)
                    print(f"trainpipe warm host: {module} not preloaded: {exc}", file=sys.stderr)

    def _accept(self) -> None:
        conn, _ = self.listener.accept()
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        if struct.unpack("3i", creds)[1] != os.getuid():  # the namespace is the machine's: only our own user
            conn.close()
            return
        try:
            msg, fds, _flags, _addr = socket.recv_fds(conn, _HEADER.size, _MAX_FDS)
            (size,) = _HEADER.unpack(msg)
            body = b""
            while len(body) < size:
                chunk = conn.recv(size - len(body))
                if not chunk:
                    raise OSError("the asker left")
                body += chunk
            request = json.loads(body)
        except (OSError, ValueError, struct.error):
            conn.close()
            return
        try:
            refusal = self._refusal(request)
            if refusal:
                conn.sendall(json.dumps({"refused": refusal}).encode() + b"\n")
                conn.close()
                return
            # a stop signal sent to the step as it is forked waits until it has its own handlers
            signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
            try:
                pid = os.fork()
                if pid == 0:
                    self._become(conn, request, fds)  # never returns
            finally:
                signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
            self.alive.add(pid)
            conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
            self.steps[conn] = (pid, int(request["deathsig"]))
        except OSError:
            conn.close()
        finally:
            for fd in fds:
                os.close(fd)

    def _refusal(self, request: dict[str, Any]) -> str:
        import threading

        if self.orphaned:
            return "the run is ending"
        if request.get("python") != self.python:
            return "other PYTHON* settings"
        if _cuda_driver_loaded():
            return "CUDA's driver is loaded in the host (a forked process cannot use it)"
        if threading.active_count() != 1:
            return "a thread is alive in the host"
        return ""

    def _reap(self) -> None:
        while True:
            try:
                pid, status, usage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self.alive.discard(pid)
            for conn, (step, _sig) in list(self.steps.items()):
                if step == pid:
                    del self.steps[conn]
                    with contextlib.suppress(OSError):
                        ended = {
                            "code": os.waitstatus_to_exitcode(status),
                            "cpu": usage.ru_utime + usage.ru_stime,  # its own and its waited-for children's
                            "maxrss_kb": usage.ru_maxrss,
                        }
                        conn.sendall(json.dumps(ended).encode() + b"\n")
                    conn.close()

    def _asker_gone(self, conn: socket.socket) -> None:
        """A readable connection: its asker died (or wrote, which it never does): the step gets its lifeline's
        signal, as a guarded child of the asker would."""
        pid, sig = self.steps.pop(conn)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        conn.close()

    def _become(self, conn: socket.socket, request: dict[str, Any], fds: list[int]) -> None:
        code = 1
        try:
            host = os.getppid()
            _prctl_deathsig(signal.SIGKILL)
            if os.getppid() != host:
                os._exit(1)
            signal.set_wakeup_fd(-1)
            for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP, ORPHANED):
                signal.signal(sig, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
            asker = os.dup(conn.fileno())  # above every descriptor placed below
            keep = fcntl_dupfd(asker, 256)
            os.close(asker)
            for other in (self.listener, *self.steps, conn):
                other.close()
            os.close(self.wake_r)
            os.close(self.wake_w)
            high = [fcntl_dupfd(fd, 256) for fd in fds]
            for fd in fds:
                os.close(fd)
            for target, fd in zip(request["fds"], high, strict=True):
                os.dup2(fd, target)
                os.close(fd)
            if request["session"]:
                os.setsid()
            os.chdir(request["cwd"])
            if request.get("umask") is not None:
                os.umask(int(request["umask"]))
            env = dict(request["env"])
            if PARENT_ENV in env:  # whoever checks its parent is still there: the host is its parent now
                env[PARENT_ENV] = str(os.getppid())
            env[ASKER_FD_ENV] = f"{os.getpid()}:{keep}"
            os.environ.clear()
            os.environ.update(env)
            argv = list(request["argv"])
            _set_title([sys.executable, "-m", *argv])
            _fresh_state(env)
            code = _run_module(argv[0], argv[1:], request["cwd"])
        except BaseException:  # noqa: BLE001 (a fork must never return into the host's loop)
            import traceback

            traceback.print_exc()
        finally:
            os._exit(code)


def fcntl_dupfd(fd: int, lowest: int) -> int:
    import fcntl

    return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, lowest)


def _cuda_driver_loaded() -> bool:
    """Whether this process has loaded CUDA's driver (``cuInit``): a process forked after that cannot use the GPU
    (importing torch does not load it; asking it for the devices does)."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as fh:
            return any("/libcuda.so" in line for line in fh)
    except OSError:
        return False


def _prctl_deathsig(sig: int) -> None:
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, int(sig))


def _set_title(argv: list[str]) -> None:
    """Write the step's command line over the host's (its :data:`TITLE_ROOM` of padding), as ``setproctitle``
    does, so that ``ps`` and ``/proc/PID/cmdline`` show the step; the environment block is left as it is."""
    try:
        with open("/proc/self/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
        start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end: fields 48 and 49 of proc(5)
        import ctypes

        title = b"\0".join(a.encode(errors="surrogateescape") for a in argv)[: end - start - 1]
        ctypes.memmove(start, title + b"\0" * (end - start - len(title)), end - start)
    except (OSError, ValueError, IndexError):
        pass


def _fresh_state(env: dict[str, str]) -> None:
    """What a fresh interpreter would have had of its own: random seeds, torch's threads from its environment."""
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()
    torch = sys.modules.get("torch")
    threads = env.get("OMP_NUM_THREADS", "")
    if torch is not None and threads.isdigit() and int(threads) > 0:
        torch.set_num_threads(int(threads))


def _run_module(module: str, args: list[str], cwd: str) -> int:
    """``python -m module args`` in this process; its exit code, once the interpreter's end has run."""
    import atexit
    import runpy
    import threading

    sys.argv = [module, *args]
    sys.path[0] = cwd
    code = 0
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = _exit_code(exc.code)
    except KeyboardInterrupt:
        code = 128 + signal.SIGINT
    except BaseException:  # noqa: BLE001 (the interpreter's own report of an uncaught error)
        sys.excepthook(*sys.exc_info())
        code = 1
    with contextlib.suppress(Exception):
        threading._shutdown()  # type: ignore[attr-defined]  # joins non-daemon threads, as an ending interpreter does
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    return code


def _exit_code(value: Any) -> int:
    if value is None:
        return 0
    if isinstance(value, int):
        return value & 0xFF
    with contextlib.suppress(Exception):
        print(value, file=sys.stderr)
    return 1


def main(argv: list[str]) -> int:
    """``python -m trainpipe.contract.warm FD PARENT [PADDING]``: serve on the listening socket FD until the
    engine's process (PARENT) is gone and the steps forked have ended; the padding is the room each step's
    command line takes."""
    preload = preload_list(os.environ.get(PRELOAD_ENV))
    host = Host(socket.socket(fileno=int(argv[0])), preload)
    _prctl_deathsig(ORPHANED)
    host.orphaned = os.getppid() != int(argv[1])  # it died before the host asked to hear of it
    try:
        host.serve()
    finally:
        host.listener.close()
    return 0


def start() -> tuple[Any, str]:
    """Start a host for this process's run: the process and its socket's name, to put in :data:`HOST_ENV` of
    the engine's environment. Stop it with :func:`stop`."""
    import secrets
    import subprocess

    path = f"@trainpipe-warm-{os.getpid()}-{secrets.token_hex(8)}"
    # bound and listening here: a step that asks before the host has started waits in its queue
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(_address(path))
        listener.listen(64)
        fd = listener.fileno()
        proc = subprocess.Popen(
            [sys.executable, "-m", "trainpipe.contract.warm", str(fd), str(os.getpid()), " " * TITLE_ROOM],
            stdin=subprocess.DEVNULL,
            env={k: v for k, v in os.environ.items() if k != HOST_ENV},
            pass_fds=(fd,),
        )
    return proc, path


def stop(proc: Any) -> None:
    """End the host (every step it forked has ended by now: each asker waited for its own)."""
    with contextlib.suppress(ProcessLookupError):
        proc.kill()
    proc.wait()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
