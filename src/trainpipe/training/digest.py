"""A digest of a model's weights that every backend computes the same way (numpy only).

It is taken at every run's end (the rank's telemetry: equal digests on every rank mean the ranks agree), so
for a big model it is on the end phase's path: a 4 GB model is seconds of sha256 in one stream. The bytes
are hashed in pieces on a few threads instead (hashlib releases the GIL), each piece's digest then hashed in
order, without copying them.
"""

from __future__ import annotations

import os
from typing import Any

#: The pieces hashed apart (bytes).
PIECE = 16 << 20


def weights_digest(state: dict[str, Any]) -> str:
    """sha256 over a state dict's names and the sha256 of each :data:`PIECE` of their float32 bytes: equal
    digests mean equal weights."""
    import hashlib
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    def piece(data: Any) -> bytes:
        return hashlib.sha256(data).digest()

    names: list[bytes] = []
    pieces: list[list[Any]] = []  # each name's pieces
    for name in sorted(state):
        flat = np.ascontiguousarray(np.asarray(state[name], dtype=np.float32)).reshape(-1).view(np.uint8)  # no copy
        names.append(name.encode())
        pieces.append([flat[i : i + PIECE] for i in range(0, max(len(flat), 1), PIECE)])
    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        hashed = iter(list(pool.map(piece, [p for each in pieces for p in each])))
    h = hashlib.sha256()
    for encoded, each in zip(names, pieces, strict=True):
        h.update(encoded)
        for _ in each:
            h.update(next(hashed))
    return h.hexdigest()
