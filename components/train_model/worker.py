"""One training rank, started by torchrun: ``python -m trainpipe.components.train_model.worker CONFIG``.

Rank 0 alone writes metrics, checkpoints and the model. Every rank writes its own
telemetry (per-step timings) for profile_training. A user error is recorded in
``<output_dir>/.errors/rank<N>.json`` so the launcher can report it as one line.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from trainpipe.components.train_model.spec import (
    CHECKPOINT_DIR,
    METRICS_FILE,
    MODEL_FILE,
    MODEL_META,
    TELEMETRY_DIR,
    TrainModelConfig,
)
from trainpipe.contract.errors import InputError, TrainpipeError
from trainpipe.contract.io import atomic_write_bytes, atomic_write_json, atomic_write_text


def prepare_data(config: TrainModelConfig) -> dict[str, Any]:
    """Read the snapshot and build the training arrays (the same on every rank).

    Returns:
        ``x`` (scaled train features), ``y`` (class indices), and the metadata
        model.json records: feature columns, classes, mean, std, split.
    """
    import numpy as np

    from trainpipe.tabular import encode_labels, features_and_label, read_table, split_indices

    df = read_table(config.data, "data")
    cols, x, y_raw = features_and_label(df, config.label_column)
    classes, y = encode_labels(y_raw)
    if len(classes) < 2:
        raise InputError(f"label_column: {config.label_column!r} has a single class; nothing to learn")
    train_idx, _ = split_indices(len(df), config.test_fraction, config.seed)
    xt = x[train_idx]
    mean = xt.mean(axis=0)
    std = xt.std(axis=0)
    std[std == 0] = 1.0
    return {
        "x": ((xt - mean) / std).astype(np.float32),
        "y": y[train_idx],
        "feature_columns": cols,
        "classes": classes,
        "mean": mean.tolist(),
        "std": std.tolist(),
        "n_train": int(len(train_idx)),
    }


def _save_checkpoint(ckpt_dir: Path, epoch: int, state: dict[str, Any], keep: int) -> None:
    import io

    import torch

    buf = io.BytesIO()
    torch.save(state, buf)
    atomic_write_bytes(ckpt_dir / f"ckpt-epoch{epoch:06d}.pt", buf.getvalue())
    for old in sorted(ckpt_dir.glob("ckpt-epoch*.pt"))[:-keep]:
        old.unlink(missing_ok=True)


def _load_latest_checkpoint(ckpt_dir: Path) -> dict[str, Any] | None:
    """The newest checkpoint that loads (weights_only); a corrupt one is skipped with a warning."""
    import torch

    for path in sorted(ckpt_dir.glob("ckpt-epoch*.pt"), reverse=True):
        try:
            return torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:
            print(f"train_model: skipping unreadable checkpoint {path.name}: {str(exc).splitlines()[0]}", file=sys.stderr)
    return None


def train(config: TrainModelConfig) -> None:
    """Train on this rank until the configured epochs are done."""
    import numpy as np
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    from trainpipe.components.train_model.models import build_mlp

    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = config.device == "cuda" or (config.device == "auto" and torch.cuda.is_available())
    device = torch.device(f"cuda:{local_rank}" if use_cuda else "cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    backend = config.dist_backend if config.dist_backend != "auto" else ("nccl" if use_cuda else "gloo")
    dist.init_process_group(backend, timeout=timedelta(seconds=config.collective_timeout_s))
    out = Path(config.output_dir)
    ckpt_dir = Path(config.checkpoint_dir) if config.checkpoint_dir else out / CHECKPOINT_DIR
    try:
        data = prepare_data(config)
        torch.manual_seed(config.seed)
        np.random.seed(config.seed)
        model = build_mlp(len(data["feature_columns"]), config.hidden_units, len(data["classes"])).to(device)
        ddp = DDP(model, device_ids=[local_rank] if use_cuda else None)
        opt = torch.optim.SGD(ddp.parameters(), lr=config.learning_rate, momentum=0.9)
        dataset = TensorDataset(torch.from_numpy(data["x"]), torch.from_numpy(data["y"]))
        sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=config.seed)
        loader = DataLoader(dataset, batch_size=config.batch_size // world, sampler=sampler)
        loss_fn = torch.nn.CrossEntropyLoss()
        start_epoch = 0
        ckpt = _load_latest_checkpoint(ckpt_dir) if ckpt_dir.exists() else None
        if ckpt is not None:
            model.load_state_dict(ckpt["model"])
            opt.load_state_dict(ckpt["optimizer"])
            start_epoch = int(ckpt["epoch"]) + 1
            torch.set_rng_state(ckpt["rng"])
        steps: list[dict[str, float]] = []
        t_start = time.perf_counter()
        metrics_path = out / METRICS_FILE
        metrics_lines = [
            line
            for line in (metrics_path.read_text(encoding="utf-8").splitlines() if metrics_path.exists() else [])
            if line.strip() and json.loads(line)["epoch"] < start_epoch
        ]
        for epoch in range(start_epoch, config.epochs):
            sampler.set_epoch(epoch)
            ddp.train()
            sums = torch.zeros(3, dtype=torch.float64)
            t_prev = time.perf_counter()
            for xb, yb in loader:
                t_data = time.perf_counter()
                xb, yb = xb.to(device), yb.to(device)
                opt.zero_grad(set_to_none=True)
                logits = ddp(xb)
                loss = loss_fn(logits, yb)
                t_fwd = time.perf_counter()
                loss.backward()
                t_bwd = time.perf_counter()
                opt.step()
                if use_cuda:
                    torch.cuda.synchronize()
                t_end = time.perf_counter()
                n = int(yb.shape[0])
                sums += torch.tensor([float(loss.detach()) * n, float((logits.argmax(1) == yb).sum()), n], dtype=torch.float64)
                steps.append(
                    {
                        "epoch": epoch,
                        "samples": n,
                        "data_s": t_data - t_prev,
                        "forward_s": t_fwd - t_data,
                        "backward_s": t_bwd - t_fwd,
                        "optimizer_s": t_end - t_bwd,
                        "step_s": t_end - t_prev,
                        "t": t_end - t_start,
                    }
                )
                t_prev = time.perf_counter()
            dist.all_reduce(sums)
            loss_e, acc_e = float(sums[0] / sums[2]), float(sums[1] / sums[2])
            if rank == 0:
                metrics_lines.append(json.dumps({"epoch": epoch, "loss": loss_e, "accuracy": acc_e}))
                atomic_write_text(metrics_path, "".join(l + "\n" for l in metrics_lines))
                _save_checkpoint(
                    ckpt_dir,
                    epoch,
                    {"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": epoch, "rng": torch.get_rng_state()},
                    config.keep_checkpoints,
                )
                print(f"train_model: epoch {epoch + 1}/{config.epochs} loss {loss_e:.4f} accuracy {acc_e:.4f}", file=sys.stderr)
        wall = time.perf_counter() - t_start
        peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
        atomic_write_json(
            out / TELEMETRY_DIR / f"rank{rank}.json",
            {
                "rank": rank,
                "world_size": world,
                "device": str(device),
                "dist_backend": backend,
                "threads": torch.get_num_threads(),
                "wall_s": wall,
                "peak_rss_mb": peak_rss_mb,
                "peak_device_mb": (torch.cuda.max_memory_allocated(device) / 2**20) if use_cuda else None,
                "steps": steps,
            },
        )
        dist.barrier()
        if rank == 0:
            from safetensors.torch import save

            state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
            atomic_write_bytes(out / MODEL_FILE, save(state))
            atomic_write_json(
                out / MODEL_META,
                {
                    "arch": "mlp",
                    "framework": "torch",
                    "input_dim": len(data["feature_columns"]),
                    "hidden_units": config.hidden_units,
                    "classes": data["classes"],
                    "feature_columns": data["feature_columns"],
                    "label_column": config.label_column,
                    "mean": data["mean"],
                    "std": data["std"],
                    "split": {"test_fraction": config.test_fraction, "seed": config.seed},
                    "task": "classification",
                    "resumed_from_epoch": start_epoch,
                    "dist_backend": backend,
                    "device": device.type,
                    "world_size": world,
                    "wall_s": wall,
                },
            )
    finally:
        dist.destroy_process_group()


def main(argv: list[str]) -> int:
    config = TrainModelConfig.model_validate_json(Path(argv[0]).read_text(encoding="utf-8"))
    try:
        train(config)
    except TrainpipeError as exc:
        rank = os.environ.get("RANK", "0")
        atomic_write_json(Path(config.output_dir) / ".errors" / f"rank{rank}.json", {"type": type(exc).__name__, "message": str(exc)})
        print(f"train_model rank {rank}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
