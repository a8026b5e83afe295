"""The TensorFlow backend's strategy: MultiWorkerMirroredStrategy across workers (MirroredStrategy
for one), with the same duties as the torch strategies: this rank's place in the job, host numbers
summed over workers, a batch spread over the worker's replicas, and which failures mean a peer
died. Imports TensorFlow.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

if TYPE_CHECKING:  # pragma: no cover
    from trainpipe.training.settings import TrainModelConfig


class TFStrategy:
    """``backend: tensorflow``.

    Attributes:
        strategy: The ``tf.distribute`` strategy (what a training function's ``ctx.strategy`` is).
        name: Its class name (the run's ``dist_backend``).
        rank, world_size: This worker's place in the job.
    """

    def __init__(self, settings: TrainModelConfig) -> None:
        if "TF_CONFIG" in os.environ:
            options = tf.distribute.experimental.CommunicationOptions(
                timeout_seconds=float(settings.collective_timeout_s)
            )
            self.strategy: Any = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
            self.name = "MultiWorkerMirroredStrategy"  # its class is named CollectiveAllReduceStrategy
        else:
            self.strategy = tf.distribute.MirroredStrategy()
            self.name = "MirroredStrategy"
        resolver = getattr(self.strategy, "cluster_resolver", None)
        self.rank = int(resolver.task_id) if resolver is not None and resolver.task_type else 0
        extended = self.strategy.extended
        self.world_size = int(extended._num_workers) if hasattr(extended, "_num_workers") else 1
        strategy = self.strategy

        @tf.function
        def reduce_sums(local: Any) -> Any:
            return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(tf.identity, args=(local,)), axis=None)

        self._reduce_sums = reduce_sums

    @property
    def local_replicas(self) -> int:
        """Replicas on this worker (one per device; one on a CPU)."""
        return self.strategy.num_replicas_in_sync // self.world_size

    def local_results(self, value: Any) -> list[Any]:
        """A per-replica value's parts on this worker (a plain value is one part)."""
        try:
            return list(self.strategy.experimental_local_results(value))
        except (TypeError, ValueError):
            return [value]

    def host_sum(self, values: list[float]) -> list[float]:
        """Host numbers summed over every worker."""
        # every local replica receives this worker's values: the sum over replicas counts each worker that many times
        local = np.asarray(values, dtype=np.float64) / self.local_replicas
        return self._reduce_sums(tf.constant(local)).numpy().tolist()

    def to_replicas(self, batch: np.ndarray) -> Any:
        """This worker's share of a batch, split evenly over its local replicas."""
        if self.local_replicas == 1:
            return tf.constant(batch)
        parts = np.array_split(batch, self.local_replicas)
        first = self.rank * self.local_replicas
        return self.strategy.experimental_distribute_values_from_function(
            lambda ctx: tf.constant(parts[ctx.replica_id_in_sync_group - first])
        )

    @staticmethod
    def peer_failure(exc: BaseException) -> bool:
        """Whether ``exc`` is a collective that failed because a peer died or hung."""
        dead = (tf.errors.UnavailableError, tf.errors.DeadlineExceededError, tf.errors.CancelledError)
        return isinstance(exc, dead) or (isinstance(exc, tf.errors.InternalError) and "ollective" in str(exc))
