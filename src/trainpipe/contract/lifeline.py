"""Child processes that die with the process that started them. Stdlib only: the faces use it inside a
container, the launcher for its ranks, ``trainpipe run`` for its engine.

``python -S -c guard(sig) cmd...`` asks the kernel to send ``sig`` to the child when its parent dies
(``PR_SET_PDEATHSIG``), checks the parent did not die in between, then becomes ``cmd``. A face's
entrypoint gets SIGTERM: it stops its ranks at their step's end, checkpoints and exits 75, so a killed
Airflow task (SIGKILL: a timeout, "mark failed", an OOM) or a killed KFP body leaves no training behind
and a retry resumes. Not ``preexec_fn``: Python between fork and exec can deadlock while the parent has
threads. Where ``prctl`` does not exist (not Linux) the child simply runs.

A guard reaches one level down. A command whose children have no lifeline of their own (an engine:
kfp.local's task processes, Airflow's) runs under :func:`supervise` (``python -m
trainpipe.contract.lifeline cmd...``, built by :func:`supervised`): a small process that learns of its
parent's death the same way and adopts every process of the tree below it (``PR_SET_CHILD_SUBREAPER``).
Asked to stop (a SIGTERM, a Ctrl-C), it stops the whole tree with a grace period (a training checkpoints);
when its parent dies (``trainpipe run`` killed), nobody waits for a checkpoint or reads a result: it kills
every process of the tree at once, whatever phase it is in (an entrypoint still importing, ranks still
starting, an MLflow run about to be opened), and returns only once every process of it is gone.
"""

from __future__ import annotations

import os
import signal
import sys
import time

#: Set for each guarded child: the pid it must still be the child of once it asked to die with it.
PARENT_ENV = "TRAINPIPE_PARENT_PID"
#: What a stopped tree has to exit before what is left of it is killed: Kubernetes' default grace period,
#: within which a training's ranks checkpoint and stop (the bench measures it under 10 s).
STOP_GRACE_S = 30.0
#: What asks a supervised tree to stop: a SIGTERM (a job cancelled, a pod deleted), a Ctrl-C, a closed terminal.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
#: A supervisor's exit code when it was stopped: the training steps checkpointed, a retry resumes them.
EXIT_STOPPED = 75

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


def guard(signum: int = signal.SIGTERM) -> str:
    """The ``python -c`` program that dies with its parent by ``signum``, then execs ``sys.argv[1:]``."""
    return (
        "import os, sys\n"
        "try:\n"
        "    import ctypes\n"
        f"    ctypes.CDLL('libc.so.6', use_errno=True).prctl({_PR_SET_PDEATHSIG}, {int(signum)})\n"
        "except (OSError, AttributeError):\n"
        "    pass\n"
        f"if os.getppid() != int(os.environ.pop('{PARENT_ENV}', os.getppid())): os._exit(1)\n"
        "os.execvp(sys.argv[1], sys.argv[1:])\n"
    )


def guarded(cmd: list[str], signum: int = signal.SIGTERM) -> list[str]:
    """``cmd`` started so that it gets ``signum`` when this process dies (set :data:`PARENT_ENV` to this pid).
    The guard's interpreter skips ``site`` (``-S``: it needs only the standard library), a third of its start."""
    return [sys.executable, "-S", "-c", guard(signum), *cmd]


def supervised(cmd: list[str]) -> list[str]:
    """``cmd`` run under :func:`supervise`: its whole process tree ends when this process dies or stops it
    (set :data:`PARENT_ENV` to this pid; send one of :data:`STOP_SIGNALS` to stop it)."""
    return [sys.executable, "-m", "trainpipe.contract.lifeline", *cmd]


def _prctl(option: int, value: int) -> None:
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(option, value)
    except (OSError, AttributeError):  # not Linux: no lifeline, the command simply runs
        pass


def descendants(root: int) -> list[int]:
    """Every process below ``root`` (from ``/proc``; none where there is no ``/proc``), parents first."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8", errors="replace") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])  # after "pid (comm) state"
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop(0)
        found.append(pid)
        todo += children.get(pid, [])
    return found


def _kill(pid: int, signum: int, group: bool = False) -> None:
    try:
        (os.killpg if group else os.kill)(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def supervise(cmd: list[str], grace: float = STOP_GRACE_S) -> int:
    """Run ``cmd`` in a process group of its own and return its exit code once it and every process it
    left behind have exited; stop the tree when this process is asked to (:data:`STOP_SIGNALS`) or when
    its parent dies (it gets SIGTERM then).

    A stop ends ``cmd`` itself at once (SIGKILL): it is a driver, an engine, whose own answer to SIGTERM
    may be to run the work again (Airflow's task runner calls the operator's ``on_kill``, then retries the
    task). Everything it started gets SIGTERM: the processes of its group directly (kfp.local's task
    processes, a KFP body's entrypoint), those in sessions of their own through their own lifelines (a
    step's entrypoint, guarded, stops its ranks at their step's end and checkpoints). Whatever is still
    there ``grace`` seconds later is killed. The parent's death is no stop but a kill: every process of the
    tree gets SIGKILL at once, and again each time one appears (a fork under way), until none is left.

    Returns:
        ``cmd``'s exit code (``128 + n`` when signal ``n`` ended it, a shell's convention), or
        :data:`EXIT_STOPPED` after a stop.
    """
    _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    parent = os.getppid()
    if parent != int(os.environ.pop(PARENT_ENV, parent)):
        return 1  # the parent died before the lifeline was in place
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)  # an orphan of the tree is adopted here, not by init: it is waited for
    waited = (signal.SIGCHLD, *STOP_SIGNALS)
    for signum in waited:
        signal.signal(signum, lambda *_: None)  # caught, never ignored: each is taken by sigwaitinfo
    before = signal.pthread_sigmask(signal.SIG_BLOCK, waited)
    pid = os.fork()
    if pid == 0:  # this process has one thread: Python between fork and exec is safe here
        try:
            signal.pthread_sigmask(signal.SIG_SETMASK, before)
            os.setpgid(0, 0)
            _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)  # the supervisor itself killed: the driver goes too
            os.execvp(cmd[0], cmd)
        finally:
            os._exit(127)
    try:
        os.setpgid(pid, pid)  # also here: whichever runs first, the group exists before it is signalled
    except OSError:
        pass
    return _wait_tree(pid, waited, grace, parent)


def _wait_tree(pid: int, waited: tuple[int, ...], grace: float, parent: int | None = None) -> int:
    """Reap the tree under this process until none of it is left; stop it on a signal of :data:`STOP_SIGNALS`
    (``waited``, blocked, are taken here one by one), kill it at once when ``parent`` is no longer this
    process's parent. :func:`supervise`'s exit code."""
    code: int | None = None
    stopped = killing = False
    deadline: float | None = None  # once set, the tree is ending: what is left at the deadline is killed
    while True:
        try:
            while True:  # reap what has exited (one SIGCHLD may stand for several)
                got, status = os.waitpid(-1, os.WNOHANG)
                if got == 0:
                    break
                if got == pid:
                    code = os.waitstatus_to_exitcode(status)
                    if deadline is None:  # what it left behind in its group ends with it
                        deadline = time.monotonic() + grace
                        _kill(pid, signal.SIGTERM, group=True)
        except ChildProcessError:
            break  # no child left: every process of the tree has exited (an orphan would be this one's child)
        if not killing and parent is not None and os.getppid() != parent:  # its parent died: nobody waits
            stopped = killing = True
        if killing:  # again each time: a process forked while the last ones were killed is killed too
            for child in descendants(os.getpid()):
                _kill(child, signal.SIGKILL)
        info: signal.struct_siginfo | None
        if killing:
            info = signal.sigtimedwait(waited, 0.1)
        elif deadline is None:
            info = signal.sigwaitinfo(waited)
        else:
            info = signal.sigtimedwait(waited, max(0.0, deadline - time.monotonic()))
        if killing:
            continue
        if info is None:  # the grace is over
            killing = True
        elif info.si_signo != signal.SIGCHLD and not stopped:
            if parent is not None and os.getppid() != parent:
                continue  # the parent's death (its lifeline's signal): killed on the next turn
            stopped = True
            deadline = min(deadline or float("inf"), time.monotonic() + grace)
            _kill(pid, signal.SIGKILL)
            _kill(pid, signal.SIGTERM, group=True)
    if stopped:
        return EXIT_STOPPED
    if code is None:
        return 1
    return 128 - code if code < 0 else code


if __name__ == "__main__":  # python -m trainpipe.contract.lifeline cmd...
    sys.exit(supervise(sys.argv[1:]))
