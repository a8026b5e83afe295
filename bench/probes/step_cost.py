"""The context's cost per step, measured in one process: teampkg.tiny run by trainpipe's context (the
worker's own make_context, DDP's one-process path, the loop, its step records) and the same training as a
bare loop, alternately (ABAB, ROUNDS rounds), on the same rows and batches.

Wall-clock steps on a shared 2-core machine swing by ±100 µs between rounds of the *same* loop, more than
the cost measured, so each side is timed by this thread's CPU time, and at two lengths (EPOCHS and
3 x EPOCHS): the slope between them is the CPU time a step costs, and what a run does once (reading and
checking the data, saving the model, the process group) cancels out.

python step_cost.py DATA.csv OUT_DIR EPOCHS BATCH ROUNDS
Prints one JSON line: each round's CPU seconds per step for both.
"""

import json
import sys
import time
from pathlib import Path


def bare(x, y, batches, n_classes):
    import torch

    t0 = time.thread_time()
    torch.manual_seed(0)
    model = torch.nn.Linear(x.shape[1], n_classes)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    kept = []
    for idx in batches:
        loss = torch.nn.functional.cross_entropy(model(x.index_select(0, idx).float()), y.index_select(0, idx))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        kept.append(loss.detach())
    return time.thread_time() - t0


def ours(settings):
    from teampkg import tiny

    from trainpipe.training.worker import _seed, make_context

    t0 = time.thread_time()
    ctx = make_context(settings)
    try:
        _seed(settings.seed, ctx.framework)
        tiny.train(ctx, {})
    finally:
        ctx.close()
    return time.thread_time() - t0


def main() -> None:
    import shutil

    import torch

    from trainpipe.components.train_model.spec import TrainModelConfig
    from trainpipe.training import control
    from trainpipe.training.data import Snapshot, rank_batches

    data, out, epochs, batch, rounds = sys.argv[1], Path(sys.argv[2]), *map(int, sys.argv[3:6])
    control.install(None)

    def settings(n: int) -> TrainModelConfig:
        return TrainModelConfig(
            data=data,
            output_dir=str(out),
            train_function="teampkg.tiny:train",
            nproc_per_node=1,
            batch_size=batch,
            epochs=n,
            checkpoint_every_s=0,
            metrics_port=0,
            device="cpu",
            seed=0,
        )

    table = Snapshot(data, "label", "classification", 0.2, 0, batch).table()
    x, y = torch.as_tensor(table.x), torch.as_tensor(table.y)

    def batches(n: int) -> list:
        return [torch.from_numpy(r) for e in range(n) for r in rank_batches(len(x), batch, 0, e, 0, 1)]

    def trained(n: int) -> float:
        shutil.rmtree(out, ignore_errors=True)
        return ours(settings(n))

    short, long = batches(epochs), batches(3 * epochs)
    steps = len(long) - len(short)
    result: dict = {"bare": [], "trainpipe": [], "steps": steps}
    for i in range(rounds):
        for side in ("bare", "trainpipe") if i % 2 == 0 else ("trainpipe", "bare"):
            if side == "bare":
                cost = bare(x, y, long, table.n_outputs) - bare(x, y, short, table.n_outputs)
            else:
                cost = trained(3 * epochs) - trained(epochs)
            result[side].append(cost / steps)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
