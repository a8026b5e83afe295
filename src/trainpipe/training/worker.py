"""One rank of a training job: ``python -m trainpipe.training.worker CONFIG``.

torchrun, horovodrun and trainpipe's TensorFlow launcher all start this. It makes the backend's
context, imports the training function, calls ``function(ctx, train_config)`` (``train_config`` as the
pydantic model the function declares for it, if it does) and checks what the
function left: at least one step, a saved model. A trainpipe error (bad data, a wrong function,
an exception raised by the team's code) is written to ``<output_dir>/.errors/rank<N>.json`` for
the launcher, which stops the group at once instead of restarting it: retrying cannot fix it.
"""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainpipe.contract.errors import Preempted, TrainpipeError, UserCodeError
from trainpipe.contract.io import atomic_write_json
from trainpipe.contract.layout import ERRORS_DIR
from trainpipe.training.backends import BACKENDS

if TYPE_CHECKING:  # pragma: no cover
    from trainpipe.training.settings import TrainModelConfig


#: What a rank's error file carries beside its one line, when the error has it: the team's whole error
#: (``detail``), where a stop left the run (``step``, and ``checkpoint``: None when none was written).
ERROR_FIELDS = ("detail", "step", "checkpoint")


class PeerFailure(Exception):
    """A collective failed because another rank died or hung: not this function's fault."""


def make_context(settings: TrainModelConfig) -> Any:
    """The context of the settings' backend (its framework is imported here, in the rank)."""
    if BACKENDS[settings.backend].framework == "tensorflow":
        from trainpipe.training.tf.context import TFContext

        return TFContext(settings)
    from trainpipe.training.torch.context import TorchContext

    return TorchContext(settings)


def _seed(seed: int, framework: str) -> None:
    import random

    import numpy as np

    random.seed(seed)
    np.random.seed(seed % 2**32)
    if framework == "torch":
        import torch

        torch.manual_seed(seed)
    else:
        import keras

        keras.utils.set_random_seed(seed)


def _where(exc: BaseException, spec: str) -> str:
    """``file:line in function`` of the innermost frame of the team's code."""
    module = spec.partition(":")[0].split(".")[0]
    frames = [
        f
        for f in traceback.extract_tb(exc.__traceback__)
        if f"/{module}/" in f.filename or f.filename.endswith(f"/{module}.py")
    ]
    if not frames:
        frames = traceback.extract_tb(exc.__traceback__)[-1:]
    if not frames:
        return ""
    f = frames[-1]
    return f" ({Path(f.filename).name}:{f.lineno} in {f.name})"


def team_error(exc: BaseException, spec: str) -> UserCodeError:
    """The team's exception as one line (its type, its message's first line, where in the team's code) that
    keeps the whole: its full message and traceback, from the function's frame down, travel as ``detail``
    (the launcher prints them to the log above the one line)."""
    lines = str(exc).strip().splitlines()
    first = lines[0][:300] if lines else ""
    more = " …" if len(lines) > 1 or (lines and len(lines[0]) > 300) else ""
    tb = exc.__traceback__.tb_next if exc.__traceback__ is not None else None  # from the team's function down
    return UserCodeError(
        f"train_function: {spec} raised {type(exc).__name__}: {first}{more}{_where(exc, spec)}",
        detail="".join(traceback.format_exception(type(exc), exc, tb)).rstrip("\n"),
    )


def run(settings: TrainModelConfig) -> None:
    """Train on this rank (the context is closed whatever happens).

    A trainpipe error is reported (:func:`report`) before the context closes: closing breaks the
    group, and the launcher must know first that restarting cannot help."""
    from trainpipe.training.functions import resolve_function

    ctx = make_context(settings)
    metrics = None
    finished = False
    try:
        if settings.metrics_port:
            from trainpipe.services.telemetry import TrainingMetrics

            # TensorFlow's workers on one node are its ranks; torch and Horovod know their local rank
            local = ctx.local_rank if ctx.framework == "torch" or settings.nnodes > 1 else ctx.rank
            metrics = TrainingMetrics.serve(ctx, settings.metrics_port, local, settings.nproc_per_node)
        from trainpipe.training.config_types import argument

        func = resolve_function(settings.train_function, ctx.framework)
        _seed(settings.seed, ctx.framework)
        spec = settings.train_function
        config = argument(func, settings.train_config, spec)  # its typed config's instance, or the dict
        try:
            func(ctx, config)
        except TrainpipeError:
            raise
        except Exception as exc:
            _peer_failed(ctx, exc)
            raise team_error(exc, spec) from None
        try:
            ctx.finish()
        except TrainpipeError:
            raise
        except Exception as exc:
            _peer_failed(ctx, exc)
            raise
        finished = True
    except TrainpipeError as exc:
        report(settings, exc)
        raise
    finally:
        if metrics is not None:
            metrics.close(finished)
        ctx.close()


def _peer_failed(ctx: Any, exc: Exception) -> None:
    """A collective that failed because a peer died or hung: the group restarts from the newest checkpoint."""
    if ctx.peer_failure(exc):
        print(
            f"train_model rank {ctx.rank}: a collective failed ({type(exc).__name__}); the group restarts",
            file=sys.stderr,
            flush=True,
        )
        raise PeerFailure(str(exc)) from None


def report(settings: TrainModelConfig, exc: TrainpipeError) -> None:
    """The rank's error for the launcher (``<output_dir>/.errors/rank<N>.json``)."""
    rank = os.environ.get("RANK", os.environ.get("HOROVOD_RANK", "0"))
    record = {"type": type(exc).__name__, "message": str(exc), "exit_code": exc.exit_code}
    record.update({k: v for k, v in vars(exc).items() if k in ERROR_FIELDS})
    atomic_write_json(Path(settings.output_dir) / ERRORS_DIR / f"rank{rank}.json", record)


def _die_with_parent() -> None:
    """A rank dies with the process that started it (torchrun's agent, horovodrun, the launcher):
    a killed task leaves no rank behind. Set here, not between fork and exec in the launcher (not
    safe while it has threads); a rank whose launcher died before this leaves at once."""
    from trainpipe.training.launch import PARENT_ENV

    expected = os.environ.pop(PARENT_ENV, None)
    try:
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if expected is not None and os.getppid() != int(expected):
        os._exit(1)


def read_settings(config_path: str | Path) -> TrainModelConfig:
    """The settings the launcher wrote for this node's ranks (JSON: types and key order as written)."""
    from trainpipe.training.settings import TrainModelConfig

    return TrainModelConfig.model_validate_json(Path(config_path).read_text(encoding="utf-8"))


def main(config_path: str) -> int:
    from trainpipe.training import control
    from trainpipe.training.launch import PIDS_ENV

    _die_with_parent()
    control.install(os.environ.get(PIDS_ENV))  # from here a preemption signal ends the step, not the rank
    # pydantic is imported after the signals are caught: a SIGTERM during start-up must not kill the rank
    settings = read_settings(config_path)
    try:
        run(settings)
    except PeerFailure:
        return 1  # no error file: the launcher (torchrun or trainpipe) restarts the group
    except TrainpipeError as exc:
        report(settings, exc)  # again for an error before the context existed: the same file
        if not isinstance(exc, Preempted):  # an agreed stop is every rank's: the launcher says it once
            rank = os.environ.get("RANK", os.environ.get("HOROVOD_RANK", "0"))
            print(f"train_model rank {rank}: error: {exc}", file=sys.stderr, flush=True)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    from trainpipe.contract.entrypoint import exit_now

    exit_now(main(sys.argv[1]))
