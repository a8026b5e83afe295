"""tensorflow backend: one worker of a MultiWorkerMirroredStrategy job (MirroredStrategy
when the job is a single worker). ``python -m trainpipe.components.train_model.tf_worker CONFIG``
with ``TF_CONFIG`` in the environment. Imports TensorFlow (and Keras 3) only.

Keras 3's ``model.fit`` does not run under MultiWorkerMirroredStrategy on TF 2.21, so
this is a custom training loop: ``strategy.run`` of a ``tf.function`` step, the loss
averaged over the global batch. Rows are sharded exactly as the torch backends shard
them (see data.rank_batches), checkpoints are ``tf.train.Checkpoint`` files (model,
optimizer, step and the epoch's metric sums), and the trained weights are written in
the torch layout (model.safetensors), so evaluation, registration and serving are the
same whichever backend trained the model.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from trainpipe.components.train_model.data import prepare_data, rank_batches, steps_per_epoch  # noqa: E402
from trainpipe.components.train_model.rank import Fault, checkpoint_dir, model_meta, run_rank, weights_digest  # noqa: E402
from trainpipe.components.train_model.spec import METRICS_FILE, MODEL_FILE, MODEL_META, TELEMETRY_DIR, TrainModelConfig  # noqa: E402
from trainpipe.contract.io import atomic_write_bytes, atomic_write_json, atomic_write_text  # noqa: E402
from trainpipe.resources import usable_cpus  # noqa: E402

POLICIES = {"fp32": "float32", "bf16": "mixed_bfloat16", "fp16": "mixed_float16"}


def build_keras_model(arch: str, input_shape: list[int], n_classes: int, hidden_units: list[int]) -> Any:
    """The Keras twin of models.build_mlp / build_cnn (same layers, same flatten order)."""
    import keras

    layers: list[Any] = [keras.Input(shape=(int(np.prod(input_shape)),))]
    if arch == "cnn":
        c, h, w = input_shape
        layers += [
            keras.layers.Reshape((c, h, w)),
            keras.layers.Permute((2, 3, 1)),  # CHW rows -> HWC, which TF convolutions take on CPU
            keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
            keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
            keras.layers.MaxPooling2D(2),
            keras.layers.Permute((3, 1, 2)),  # back to CHW so Flatten matches torch's order
            keras.layers.Flatten(),
            keras.layers.Dense(64, activation="relu"),
        ]
    else:
        layers += [keras.layers.Dense(h, activation="relu") for h in hidden_units]
    layers.append(keras.layers.Dense(n_classes, dtype="float32"))  # logits in fp32 under any policy
    return keras.Sequential(layers)


def torch_state_dict(model: Any, arch: str) -> dict[str, np.ndarray]:
    """The Keras weights under the torch Sequential's names and layouts."""
    import keras

    trainable = [layer for layer in model.layers if layer.weights]
    if arch == "cnn":
        torch_index = [1, 3, 7, 9]
    else:
        torch_index = [2 * i for i in range(len(trainable))]
    state: dict[str, np.ndarray] = {}
    for idx, layer in zip(torch_index, trainable):
        kernel, bias = (np.asarray(w) for w in layer.get_weights())
        if isinstance(layer, keras.layers.Conv2D):
            kernel = kernel.transpose(3, 2, 0, 1)  # (kh, kw, in, out) -> (out, in, kh, kw)
        else:
            kernel = kernel.T  # (in, out) -> (out, in)
        state[f"{idx}.weight"] = np.ascontiguousarray(kernel, dtype=np.float32)
        state[f"{idx}.bias"] = np.ascontiguousarray(bias, dtype=np.float32)
    return state


def make_strategy(config: TrainModelConfig) -> Any:
    if "TF_CONFIG" in os.environ:
        options = tf.distribute.experimental.CommunicationOptions(timeout_seconds=float(config.collective_timeout_s))
        return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    return tf.distribute.MirroredStrategy()


def body(config: TrainModelConfig) -> None:
    import keras

    strategy = make_strategy(config)
    resolver = getattr(strategy, "cluster_resolver", None)
    task_id = int(resolver.task_id) if resolver is not None and resolver.task_type else 0
    workers = int(strategy.extended._num_workers) if hasattr(strategy.extended, "_num_workers") else 1
    rank, world = task_id, workers
    chief = rank == 0
    out = Path(config.output_dir)
    ckpt_root = checkpoint_dir(config)
    fault = Fault.from_env()
    data = prepare_data(config)
    keras.utils.set_random_seed(config.seed)
    keras.mixed_precision.set_global_policy(POLICIES[config.precision])
    B = config.batch_size
    with strategy.scope():
        model = build_keras_model(config.model, data["input_shape"], len(data["classes"]), config.hidden_units)
        opt: Any = keras.optimizers.SGD(learning_rate=config.learning_rate, momentum=config.momentum)
        if config.precision == "fp16":
            opt = keras.optimizers.LossScaleOptimizer(opt)
        step_var = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
        sums_var = tf.Variable(tf.zeros(3, tf.float64), trainable=False, name="epoch_sums")
        model.build((None, int(np.prod(data["input_shape"]))))
        opt.build(model.trainable_variables)
    ckpt = tf.train.Checkpoint(model=model, optimizer=opt, step=step_var, epoch_sums=sums_var)
    # Every worker saves (the save is collective); only the chief's files are kept.
    save_dir = ckpt_root if chief else ckpt_root / f".worker{rank}-tmp"
    manager = tf.train.CheckpointManager(ckpt, str(save_dir), max_to_keep=config.keep_checkpoints, checkpoint_name="ckpt")
    resumed_from = _restore_latest(ckpt, ckpt_root, chief)
    global_step = int(step_var.numpy())
    carried = sums_var.numpy().copy()

    loss_obj = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

    @tf.function
    def step_fn(xb: Any, yb: Any) -> Any:
        with tf.GradientTape() as tape:
            logits = model(xb, training=True)
            per_example = loss_obj(yb, logits)
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=B)
            scaled = opt.scale_loss(loss)  # identity unless a LossScaleOptimizer (fp16)
        grads = tape.gradient(scaled, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        correct = tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, axis=1), yb), tf.float64))
        return tf.stack([tf.cast(tf.reduce_sum(per_example), tf.float64), correct, tf.cast(tf.shape(yb)[0], tf.float64)])

    @tf.function
    def reduce_sums(local: Any) -> Any:
        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(lambda v: tf.identity(v), args=(local,)), axis=None)

    def all_reduce(local: np.ndarray) -> np.ndarray:
        # One replica per worker on CPU: the per-worker sums reduce across workers.
        return reduce_sums(tf.constant(local / strategy.num_replicas_in_sync * world, dtype=tf.float64)).numpy()

    x, y = data["x"], data["y"]
    n = x.shape[0]
    per_epoch = steps_per_epoch(n, B)
    total = per_epoch * config.epochs if config.max_steps is None else min(config.max_steps, per_epoch * config.epochs)
    start_epoch, start_in_epoch = divmod(global_step, per_epoch)
    metrics_path = out / METRICS_FILE
    history = [
        line
        for line in (metrics_path.read_text(encoding="utf-8").splitlines() if metrics_path.exists() else [])
        if line.strip() and json.loads(line)["epoch"] < start_epoch
    ]
    steps: list[dict[str, float]] = []
    # The TF profiler (TensorBoard's Profile tab) over the same window torch_loop traces: steps 4 .. 4+N.
    tf_prof = {"trace": None, "tensorboard_logdir": "tf_profile", "first_step_index": 4, "steps": config.profile_steps} if config.profile_steps and chief else None
    tf_prof_on = False
    t_start = time.perf_counter()
    first_step_s: float | None = None

    def save(sums: np.ndarray) -> None:
        step_var.assign(global_step)
        sums_var.assign(sums)
        manager.save(checkpoint_number=global_step)

    for epoch in range(start_epoch, config.epochs):
        if global_step >= total:
            break
        skip = start_in_epoch if epoch == start_epoch else 0
        batches = rank_batches(n, B, config.seed, epoch, rank, world, skip)
        if epoch != start_epoch:
            carried = np.zeros(3)
        local = np.zeros(3)
        pending: list[Any] = []
        t_prev = time.perf_counter()
        for idx in batches:
            if global_step >= total:
                break
            fault.maybe_kill("kill", rank, global_step)
            if tf_prof is not None and len(steps) == tf_prof["first_step_index"]:
                tf.profiler.experimental.start(str(out / TELEMETRY_DIR / "tf_profile"))
                tf_prof_on = True
            if tf_prof_on and len(steps) == tf_prof["first_step_index"] + tf_prof["steps"]:
                tf.profiler.experimental.stop()
                tf_prof_on = False
            xb, yb = _to_replicas(strategy, rank, world, x[idx], y[idx])
            t_data = time.perf_counter()
            pending.append(strategy.run(step_fn, args=(xb, yb)))  # summed later: no host copy per step
            if len(pending) >= FOLD_EVERY:
                local += _sum_steps(strategy, pending)
            t_end = time.perf_counter()
            global_step += 1
            if first_step_s is None:
                first_step_s = t_end - t_start
            steps.append({"epoch": epoch, "step": global_step, "samples": int(len(idx)), "data_s": t_data - t_prev,
                          "compute_s": t_end - t_data, "other_s": 0.0, "step_s": t_end - t_prev, "t": t_end - t_start})
            epoch_done = global_step % per_epoch == 0
            if config.checkpoint_every_steps and global_step % config.checkpoint_every_steps == 0 and not epoch_done and global_step < total:
                carried = carried + all_reduce(local + _sum_steps(strategy, pending))
                local = np.zeros(3)
                save(carried)
            t_prev = time.perf_counter()
            steps[-1]["other_s"] += t_prev - t_end  # bookkeeping and checkpoints count toward the step
            steps[-1]["step_s"] += t_prev - t_end
        sums = carried + all_reduce(local + _sum_steps(strategy, pending))
        carried = np.zeros(3)
        loss_e, acc_e = float(sums[0] / max(sums[2], 1)), float(sums[1] / max(sums[2], 1))
        save(np.zeros(3))
        if chief:
            history.append(json.dumps({"epoch": epoch, "step": global_step, "loss": loss_e, "accuracy": acc_e}))
            atomic_write_text(metrics_path, "".join(line + "\n" for line in history))
            print(f"train_model: epoch {epoch + 1}/{config.epochs} step {global_step} loss {loss_e:.4f} accuracy {acc_e:.4f}", file=sys.stderr)
        start_in_epoch = 0

    if tf_prof_on:
        tf.profiler.experimental.stop()
    wall = time.perf_counter() - t_start
    device = "cuda" if tf.config.list_physical_devices("GPU") else "cpu"
    strategy_name = "MultiWorkerMirroredStrategy" if "TF_CONFIG" in os.environ else "MirroredStrategy"
    weights = torch_state_dict(model, config.model)
    atomic_write_json(
        out / TELEMETRY_DIR / f"rank{rank}.json",
        {
            "rank": rank, "world_size": world, "backend": "tensorflow", "device": device,
            "dist_backend": strategy_name, "precision": config.precision,
            "weights_sha256": weights_digest(weights),
            "threads": int(os.environ.get("TF_NUM_INTRAOP_THREADS") or os.environ.get("OMP_NUM_THREADS") or 0),
            "batch_size": B, "wall_s": wall, "time_to_first_step_s": first_step_s,
            "cpu_s": resource.getrusage(resource.RUSAGE_SELF).ru_utime + resource.getrusage(resource.RUSAGE_SELF).ru_stime,
            "usable_cpus": usable_cpus(), "local_world": world if "TF_CONFIG" in os.environ and len(set(h.split(":")[0] for h in json.loads(os.environ["TF_CONFIG"])["cluster"]["worker"])) == 1 else 1,
            "device_name": device, "profiler": tf_prof,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, "peak_device_mb": None,
            "steps": steps,
        },
    )
    if not chief:
        shutil.rmtree(save_dir, ignore_errors=True)
        return
    from safetensors.numpy import save as save_tensors

    atomic_write_bytes(out / MODEL_FILE, save_tensors(weights))
    meta = model_meta(data, config, device, strategy_name, world, resumed_from, global_step, wall)
    meta["weights_layout"] = "torch"
    atomic_write_json(out / MODEL_META, meta)


def _to_replicas(strategy: Any, rank: int, world: int, xb: np.ndarray, yb: np.ndarray) -> tuple[Any, Any]:
    """This worker's batch, split evenly over its local replicas (one on CPU)."""
    local_replicas = strategy.num_replicas_in_sync // world
    if local_replicas == 1:
        return tf.constant(xb), tf.constant(yb)
    xs, ys = np.array_split(xb, local_replicas), np.array_split(yb, local_replicas)

    def local_index(ctx: Any) -> int:
        return ctx.replica_id_in_sync_group - rank * local_replicas

    dx = strategy.experimental_distribute_values_from_function(lambda ctx: tf.constant(xs[local_index(ctx)]))
    dy = strategy.experimental_distribute_values_from_function(lambda ctx: tf.constant(ys[local_index(ctx)]))
    return dx, dy


FOLD_EVERY = 512  # steps whose sums are kept as tensors before they are added up on the host


def _sum_steps(strategy: Any, pending: list[Any]) -> np.ndarray:
    """The sums of the pending steps (every local replica's), as one host array; empties ``pending``."""
    if not pending:
        return np.zeros(3)
    total = tf.add_n([v for per_replica in pending for v in strategy.experimental_local_results(per_replica)]).numpy()
    pending.clear()
    return total


def _restore_latest(ckpt: Any, ckpt_root: Path, chief: bool) -> int:
    """Restore the newest checkpoint that reads; a torn one is skipped with a warning. Returns its step."""
    state = tf.train.get_checkpoint_state(str(ckpt_root)) if ckpt_root.is_dir() else None
    candidates = list(reversed(state.all_model_checkpoint_paths)) if state is not None else []
    for path in candidates:
        try:
            ckpt.restore(path).expect_partial()
            step = int(ckpt.step.numpy())
            if chief:
                print(f"train_model: resuming from {Path(path).name} (step {step})", file=sys.stderr)
            return step
        except Exception as exc:  # a torn checkpoint: fall back to the previous one
            print(f"train_model: warning: skipping unreadable checkpoint {Path(path).name}: {str(exc).splitlines()[0][:200]}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(run_rank(sys.argv[1], body))
