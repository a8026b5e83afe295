"""Baseline: a bare TensorFlow MultiWorkerMirroredStrategy custom loop (Keras 3 model.fit does not run
under it on TF 2.21), the same model, data and sharding as train_model's tensorflow backend.
TF_CONFIG names this worker. python bare_tf.py DATA.csv LABEL EPOCHS BATCH LR SEED HIDDEN
"""

import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402
from _data import load, shard, step_figures  # noqa: E402


def main() -> None:
    path, label, epochs, batch, lr, seed, hidden = (
        sys.argv[1],
        sys.argv[2],
        int(sys.argv[3]),
        int(sys.argv[4]),
        float(sys.argv[5]),
        int(sys.argv[6]),
        int(sys.argv[7]),
    )
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    rank = int(json.loads(os.environ["TF_CONFIG"])["task"]["index"])
    world = strategy.num_replicas_in_sync
    x, y, n_classes = load(path, label, seed)
    keras.utils.set_random_seed(seed)
    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input(shape=(x.shape[1],)),
                keras.layers.Dense(hidden, activation="relu"),
                keras.layers.Dense(n_classes),
            ]
        )
        opt = keras.optimizers.SGD(learning_rate=lr, momentum=0.9)
        opt.build(model.trainable_variables)
    loss_obj = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

    @tf.function
    def step(xb, yb):
        with tf.GradientTape() as tape:
            per_example = loss_obj(yb, model(xb, training=True))
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=batch)
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables, strict=True))
        return tf.reduce_sum(per_example)

    ends, t_loop = [], time.perf_counter()
    for epoch in range(epochs):
        for idx in shard(len(x), batch, seed, epoch, rank, world):
            strategy.run(step, args=(tf.constant(x[idx]), tf.constant(y[idx])))
            ends.append(time.perf_counter() - t_loop)
    if rank == 0:
        print(json.dumps(step_figures(ends, batch)))


if __name__ == "__main__":
    main()
