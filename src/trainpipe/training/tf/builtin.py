"""The built-in functions with ``backend: tensorflow``: the Keras twin of :mod:`trainpipe.services.serving.nets`
(same layers, same flatten order), trained on the TensorFlow context, its weights written in the
torch layout so evaluation, registration and serving are the same whichever backend trained it.
Imports TensorFlow (and Keras 3) only.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from trainpipe.training.builtin import BuiltinConfig, init_args, parse


def build_keras(arch: str, args: dict[str, Any], mean: list[float], std: list[float]) -> Any:
    """The Keras model: standardize, the body, a float32 head (standardized values for regression)."""
    import keras

    features, n_out = args["features"], args["n_outputs"]
    layers: list[Any] = [
        keras.Input(shape=(features,)),
        keras.layers.Normalization(mean=np.asarray(mean), variance=np.asarray(std) ** 2),
    ]
    if arch == "cnn":
        c, h, w = args["image_shape"]
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
        layers += [keras.layers.Dense(h, activation="relu") for h in args["hidden_units"]]
    layers.append(keras.layers.Dense(n_out, dtype="float32"))  # logits in fp32 under any policy
    return keras.Sequential(layers)


def torch_state_dict(
    model: Any, arch: str, mean: list[float], std: list[float], task: str, target: tuple[float, float]
) -> dict[str, np.ndarray]:
    """The Keras weights under :class:`~trainpipe.services.serving.nets.TabularNet`'s names and layouts."""
    import keras

    dense_or_conv = [layer for layer in model.layers if isinstance(layer, (keras.layers.Dense, keras.layers.Conv2D))]
    *body, head = dense_or_conv
    names = [f"body.{i}" for i in ([1, 3, 7] if arch == "cnn" else [2 * k for k in range(len(body))])] + ["head"]
    state: dict[str, np.ndarray] = {"norm.mean": np.asarray(mean, np.float32), "norm.std": np.asarray(std, np.float32)}
    for name, layer in zip(names, [*body, head], strict=True):
        kernel, bias = (np.asarray(w) for w in layer.get_weights())
        kernel = kernel.transpose(3, 2, 0, 1) if isinstance(layer, keras.layers.Conv2D) else kernel.T
        state[f"{name}.weight"] = np.ascontiguousarray(kernel, dtype=np.float32)
        state[f"{name}.bias"] = np.ascontiguousarray(bias, dtype=np.float32)
    if task == "regression":
        state["out.mean"] = np.asarray([target[0]], np.float32)
        state["out.std"] = np.asarray([target[1]], np.float32)
    return state


def tabular(ctx: Any, config: BuiltinConfig, arch: str) -> None:
    """Train the built-in net with Keras under the context's strategy."""
    import keras

    task = ctx.settings.task
    cfg = parse(config, task)
    data = ctx.data.load()
    args = init_args(arch, cfg, data, task)
    model = ctx.prepare(build_keras(arch, args, data.mean, data.std))
    opt: Any = keras.optimizers.SGD(
        learning_rate=cfg.learning_rate, momentum=cfg.momentum, weight_decay=cfg.weight_decay or None
    )
    if ctx.precision == "fp16":
        opt = keras.optimizers.LossScaleOptimizer(opt)
    opt.build(model.trainable_variables)
    ctx.restore(model=model, optimizer=opt)
    classification = task == "classification"
    t_mean, t_std = float(data.target_mean), float(data.target_std)
    xent = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

    def per_example(y: Any, out: Any) -> Any:
        if classification:
            return xent(y, out)
        err = out[:, 0] - (tf.cast(y, tf.float32) - t_mean) / t_std  # on the target's standard scale
        if cfg.loss == "mae":
            return tf.abs(err)
        if cfg.loss == "huber":
            a = tf.abs(err)
            return tf.where(a <= 1.0, 0.5 * err**2, a - 0.5)
        return err**2

    def step(x: Any, y: Any) -> Any:
        with tf.GradientTape() as tape:
            out = model(x, training=True)
            per = per_example(y, out)
            loss = ctx.compute_loss(per)
            scaled = opt.scale_loss(loss)  # identity unless a LossScaleOptimizer (fp16)
        grads = tape.gradient(scaled, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        if classification:
            return tf.reduce_mean(per), tf.reduce_mean(
                tf.cast(tf.equal(tf.argmax(out, axis=1), tf.cast(y, tf.int64)), tf.float32)
            )
        return tf.reduce_mean(per), tf.constant(0.0)

    for x, y in ctx.batches(data):
        loss, acc = ctx.step(step, x, y)
        if classification:
            ctx.log(loss=loss, accuracy=acc)
        else:
            ctx.log(loss=loss)
    ctx.save_model(model, builder=f"builtin:{arch}", init_args=args)  # in the torch layout: served as the torch net


def mlp(ctx: Any, config: BuiltinConfig) -> None:
    """``builtin:mlp`` with ``backend: tensorflow``: the Keras twin of the torch MLP."""
    tabular(ctx, config, "mlp")


def cnn(ctx: Any, config: BuiltinConfig) -> None:
    """``builtin:cnn`` with ``backend: tensorflow``: the Keras twin of the torch CNN."""
    tabular(ctx, config, "cnn")
