"""A digest of a model's weights that every backend computes the same way (numpy only)."""

from __future__ import annotations

from typing import Any


def weights_digest(state: dict[str, Any]) -> str:
    """sha256 over a state dict's names and float32 bytes: equal digests mean equal weights."""
    import hashlib

    import numpy as np

    h = hashlib.sha256()
    for name in sorted(state):
        h.update(name.encode())
        h.update(np.ascontiguousarray(np.asarray(state[name], dtype=np.float32)).tobytes())
    return h.hexdigest()
