"""The training context for TensorFlow: MultiWorkerMirroredStrategy (MirroredStrategy for one worker).

The same shape as the torch context. The function runs inside the strategy's scope, so the
model and optimizer it makes are distributed variables; :meth:`TFContext.step` runs a step
function on every replica (``strategy.run`` of a ``tf.function``) and counts it. Keras 3's
``model.fit`` does not run under MultiWorkerMirroredStrategy on TF 2.21, which is why the loop is
the function's own. Checkpoints are ``tf.train.Checkpoint`` files of the registered objects, written
by every worker at the same step (their variables are mirrored copies; the chief's folder is kept),
through the same checkpoint manager as torch's. Imports TensorFlow (and Keras 3) only.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from trainpipe.contract.errors import InputError  # noqa: E402
from trainpipe.contract.layout import TELEMETRY_DIR
from trainpipe.training import sources  # noqa: E402
from trainpipe.training.checkpoint import StateIO  # noqa: E402
from trainpipe.training.context import BaseContext  # noqa: E402
from trainpipe.training.metrics import HostValues  # noqa: E402
from trainpipe.training.tf.strategy import TFStrategy  # noqa: E402

if TYPE_CHECKING:  # pragma: no cover
    from trainpipe.training.settings import TrainModelConfig

POLICIES = {"fp32": "float32", "bf16": "mixed_bfloat16", "fp16": "mixed_float16"}


class TFContext(BaseContext):
    """``ctx`` of a TensorFlow training function (``backend: tensorflow``).

    Attributes:
        strategy: The ``tf.distribute`` strategy the function runs under (its scope is entered).
        precision: ``fp32``, ``bf16`` or ``fp16`` (the Keras global policy is set from it).
    """

    framework = "tensorflow"

    def __init__(self, settings: TrainModelConfig) -> None:
        import keras

        self._strategy = TFStrategy(settings)
        super().__init__(settings, self._strategy.rank, self._strategy.world_size, 0, self._strategy.name)
        self.strategy = self._strategy.strategy
        self.precision = settings.precision
        keras.mixed_precision.set_global_policy(POLICIES[settings.precision])
        self._scope = self.strategy.scope()
        self._scope.__enter__()
        self._compiled: dict[Any, Any] = {}
        self._models: list[Any] = []
        self._profile: dict[str, Any] | None = (
            {"trace": None, "tensorboard_logdir": "tf_profile", "first_step_index": 4, "steps": settings.profile_steps}
            if settings.profile_steps and self.is_chief
            else None
        )
        self._profiling = False

    # --- model and steps ------------------------------------------------------------------------

    def prepare(self, model: Any) -> Any:
        """Record the model (made inside the strategy's scope, it is already distributed)."""
        self._models.append(model)
        return model

    def autocast(self) -> Any:
        """Nothing to enter: the Keras mixed-precision policy is set for the whole run."""
        return contextlib.nullcontext()

    def compute_loss(self, per_example_loss: Any) -> Any:
        """The loss to differentiate: per-example losses summed over this replica and divided by the
        global batch (``tf.nn.compute_average_loss``), so gradients add up to the global mean's."""
        return tf.nn.compute_average_loss(per_example_loss, global_batch_size=self.settings.batch_size)

    def step(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(*args)`` as one training step on every replica (``strategy.run`` of a
        ``tf.function``) and count it. ``fn`` computes the loss under a ``GradientTape`` and applies
        the gradients; what it returns (per-replica values) is what :meth:`log` takes."""
        self.timer.mark("step_start")
        compiled = self._compiled.get(fn)
        if compiled is None:
            compiled = self._compiled[fn] = tf.function(fn)
        out = self.strategy.run(compiled, args=args)
        self.timer.mark("step_end")
        self._count_step()
        return out

    def peer_failure(self, exc: BaseException) -> bool:
        return self._strategy.peer_failure(exc)

    def _last_barrier(self) -> None:
        """TF's collectives pull: a worker that has its sum may leave while a peer's last pull from
        it is still in flight, and that peer's barrier fails with 'Socket closed' (CI saw it, in
        the barrier after the training ended). The leaver had its sum, so every worker had reached
        the barrier and rank 0 had written the model: the run is whole. A peer that crashed
        instead exits non-zero, and its launcher restarts or fails the group on that."""
        try:
            self._barrier()
        except (tf.errors.UnavailableError, tf.errors.CancelledError):
            if self.world_size == 1:
                raise

    # --- reductions -----------------------------------------------------------------------------

    def _logged_values(self) -> HostValues:
        return TFValues(self._strategy)

    def _all_reduce_sum(self, values: list[float]) -> list[float]:
        return self._strategy.host_sum(values)

    # --- data ---------------------------------------------------------------------------------

    def _placement(self) -> sources.Placement:
        return _TFPlacement(self._strategy)

    def _on_batch_end(self) -> None:
        p = self._profile
        if p is None:
            return
        n = len(self.step_records)
        if n == p["first_step_index"] and not self._profiling:
            tf.profiler.experimental.start(str(self.out / TELEMETRY_DIR / "tf_profile"))
            self._profiling = True
        elif self._profiling and n == p["first_step_index"] + p["steps"]:
            tf.profiler.experimental.stop()
            self._profiling = False

    # --- checkpoints ----------------------------------------------------------------------------

    def _state_io(self, objects: dict[str, Any]) -> StateIO:
        return _TFState(objects, self)

    # --- the model ------------------------------------------------------------------------------

    def _save_model(
        self,
        model: Any,
        input_example: Any,
        init_args: dict[str, Any] | None,
        builder: Any,
        classes: list[Any] | None,
        task: str,
    ) -> None:
        """The Keras model's weights (in order) and how to rebuild it: ``builder(**init_args)`` must
        return the same, unbuilt Keras model (importable from a package; it travels with the model).
        The built-in nets (``builtin:mlp``, ``builtin:cnn``) are written in the torch layout instead,
        so evaluation and serving do not depend on the backend that trained them."""
        from trainpipe.training.builders import builder_reference
        from trainpipe.training.tf import model as tf_model

        if not self.is_chief:
            return
        if builder is None:
            raise InputError(
                "save_model: with backend tensorflow give builder= (a function returning the Keras model) and its "
                "init_args"
            )
        example = tf_model.example_frame(input_example, self._source_rows(), self.data, self.settings.label_column)
        raw = np.asarray(model(example.to_numpy(np.float32), training=False), dtype=np.float32)
        if isinstance(builder, str) and builder.startswith("builtin:"):
            weights, raw = tf_model.builtin_weights(model, builder, self._tabular, task, raw)
            code: list[str] = []
            framework, ref, classes = "torch", builder, None
        else:
            ref, code = builder_reference(builder)
            weights = {f"{i:05d}": np.asarray(v.numpy(), dtype=np.float32) for i, v in enumerate(model.weights)}
            framework = "tensorflow"
        classes = self._classes(classes, task)
        s = self.settings
        meta = {
            "framework": framework,
            "builder": ref,
            "init_args": init_args or {},
            "code": code,
            "task": task,
            "classes": list(classes or []),
            "label_column": s.label_column,
            "split": {"test_fraction": s.test_fraction, "seed": s.seed, "method": "splitmix64"},
            "train_function": s.train_function,
            "trained_with": "tensorflow",
            "precision": s.precision,
            "world_size": self.world_size,
            "device": self._device(),
            "dist_backend": self.dist_name,
        }
        tf_model.write_model(self.out, weights, meta, example, raw)

    @staticmethod
    def _device() -> str:
        return "cuda" if tf.config.list_physical_devices("GPU") else "cpu"

    # --- the end --------------------------------------------------------------------------------

    def telemetry(self) -> dict[str, Any]:
        from trainpipe.training.digest import weights_digest

        if self._profiling:
            tf.profiler.experimental.stop()
            self._profiling = False
        weights = {f"{i:05d}": np.asarray(v.numpy()) for m in self._models for i, v in enumerate(m.weights)}
        out = super().telemetry()
        local = out["local_world"]
        if "TF_CONFIG" in os.environ:
            hosts = {h.split(":")[0] for h in json.loads(os.environ["TF_CONFIG"])["cluster"]["worker"]}
            local = self.world_size if len(hosts) == 1 else 1
        out.update(
            {
                "device": self._device(),
                "device_name": self._device(),
                "local_world": local,
                "threads": int(os.environ.get("TF_NUM_INTRAOP_THREADS") or os.environ.get("OMP_NUM_THREADS") or 0),
                "weights_sha256": weights_digest(weights) if weights else None,
                "peak_device_mb": None,
                "profiler": self._profile,
            }
        )
        return out

    def close(self) -> None:
        super().close()
        with contextlib.suppress(Exception):
            self._scope.__exit__(None, None, None)


class TFValues(HostValues):
    """Logged per-replica values: each is the mean of its local replicas (one per device)."""

    def __init__(self, strategy: TFStrategy) -> None:
        self.strategy = strategy

    def fold(self, values: list[Any]) -> float:
        parts = []
        for x in values:
            local = self.strategy.local_results(x)
            parts.append(tf.add_n([tf.cast(tf.reshape(v, []), tf.float64) for v in local]) / len(local))
        return float(tf.add_n(parts).numpy())


class _TFPlacement:
    """Rows stay on the host; each batch is split over the worker's local replicas."""

    where = "host"

    def __init__(self, strategy: TFStrategy) -> None:
        self.strategy = strategy

    def place(self, arrays: list[Any]) -> list[Any]:
        return [np.asarray(a) for a in arrays]

    def gather(self, arrays: list[Any], rows: Any) -> Iterator[list[Any]]:
        for r in rows:
            yield [self.strategy.to_replicas(a[r]) for a in arrays]

    def from_host(self, batches: Iterator[tuple[Any, ...]]) -> Iterator[tuple[Any, ...]]:
        for batch in batches:
            yield tuple(self.strategy.to_replicas(np.asarray(b)) for b in batch)

    def other(
        self, source: Any, settings: TrainModelConfig, rank: int, world: int
    ) -> tuple[int, Callable[[int, int], Iterator[Any]]]:
        raise InputError(
            f"train_function: ctx.batches with backend {settings.backend} takes TabularData, a ParquetStream, "
            f"a tuple or dict of arrays, or a StreamSource, not {type(source).__name__}"
        )


class _TFState:
    """A ``tf.train.Checkpoint`` of the registered objects, written synchronously by every worker."""

    staged_bytes = 0

    def __init__(self, objects: dict[str, Any], ctx: TFContext) -> None:
        for name, obj in objects.items():
            if (
                not isinstance(obj, (tf.Module, tf.Variable))
                and not hasattr(obj, "_track_trackable")
                and not hasattr(obj, "variables")
            ):
                raise InputError(
                    f"train_function: ctx.restore({name}=...) is not a TensorFlow/Keras object a tf.train.Checkpoint "
                    "can hold"
                )
        self.ckpt, self.ctx = tf.train.Checkpoint(**objects), ctx

    def prepare(self) -> None:
        """Nothing is staged: TensorFlow writes its variables itself."""

    def stage(self, tmp: Path, step: int) -> None:
        ctx = self.ctx
        # every worker writes (its variables are mirrored copies); only the chief's folder is kept
        where = tmp if ctx.is_chief else tmp.with_name(f".worker{ctx.rank}-{tmp.name.lstrip('.')}")
        where.mkdir(parents=True, exist_ok=True)
        self.ckpt.write(str(where / "state"))
        ctx.fault.maybe_kill("kill_checkpoint", ctx.rank, step)
        ctx._barrier()
        if not ctx.is_chief:
            shutil.rmtree(where, ignore_errors=True)

    def load(self, path: Path) -> None:
        self.ckpt.read(str(path / "state")).expect_partial()
