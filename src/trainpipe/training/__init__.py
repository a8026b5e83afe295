"""trainpipe's training context: run a team's own training function with trainpipe's guarantees.

A training function is ``f(ctx, config)``: ``config`` is ``train_config``, ``ctx`` the context
of the backend the settings choose (:class:`TorchContext` for torch_ddp, torch_fsdp and
horovod; :class:`TFContext` for tensorflow)::

    def train(ctx, config):
        model = ctx.prepare(MyNet(**config["net"]))        # device; DDP, FSDP2 or Horovod
        opt = torch.optim.AdamW(model.parameters(), lr=config["lr"])
        ctx.restore(model=model, optimizer=opt)             # exact resume after a kill or a retry
        for x, y in ctx.batches(ctx.data.load()):           # sharded, seeded, resumable mid-epoch
            with ctx.autocast():
                loss = my_loss(model(x), y)
            ctx.backward(loss)
            ctx.step(opt)                                   # checkpoints, timing, faults follow it
            ctx.log(loss=loss)                              # epoch means: metrics.jsonl, MLflow
        ctx.save_model(model, init_args=config["net"])      # weights-only + an MLflow pyfunc model

and runs with ``train_function: mypkg.train:train`` through the CLI, both faces, the pipeline and
the DAGs, on every launcher. Importing this package loads no framework; the contexts import
theirs when a rank makes one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from trainpipe.training.data import ParquetStream, Snapshot, StreamSource, TabularData
    from trainpipe.training.tf.context import TFContext
    from trainpipe.training.torch.context import TorchContext

__all__ = ["ParquetStream", "Snapshot", "StreamSource", "TFContext", "TabularData", "TorchContext"]

_WHERE = {
    "TorchContext": "trainpipe.training.torch.context",
    "TFContext": "trainpipe.training.tf.context",
    "TabularData": "trainpipe.training.data",
    "ParquetStream": "trainpipe.training.data",
    "Snapshot": "trainpipe.training.data",
    "StreamSource": "trainpipe.training.data",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        from trainpipe.contract.imports import import_module

        return getattr(import_module(_WHERE[name]), name)
    raise AttributeError(name)
