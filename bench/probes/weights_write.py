"""The end phase's baseline: one ``safetensors.torch.save_file`` of a model's weights, then an fsync (the
write is done when the bytes are on the disk, as train_model's are). The weights are builtin:mlp's of the
given shape, on the host.

python weights_write.py HIDDEN[,HIDDEN…] PATH
Prints one JSON line: s (seconds for save_file and fsync), bytes, params.
"""

import json
import os
import sys
import time

import torch
from safetensors.torch import save_file

from trainpipe.services.serving import nets


def main() -> None:
    hidden, path = [int(h) for h in sys.argv[1].split(",")], sys.argv[2]
    with torch.device("meta"):
        shape = nets.mlp(64, 10, hidden).state_dict()
    state = {k: torch.randn(v.shape) if v.dim() else torch.tensor(1.0) for k, v in shape.items()}
    t = time.perf_counter()
    save_file(state, path)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    s = time.perf_counter() - t
    size = os.path.getsize(path)
    os.unlink(path)
    print(json.dumps({"s": s, "bytes": size, "params": sum(v.numel() for v in state.values())}))


if __name__ == "__main__":
    main()
