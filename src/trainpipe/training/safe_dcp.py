"""Reading a ``torch.distributed.checkpoint`` folder without running code it holds.

DCP unpickles a checkpoint's ``.metadata`` with plain ``pickle`` and its non-tensor items with
``torch.load(weights_only=False)``: a checkpoint folder that is not ours (a shared volume, a
restored backup) could run code as it is read. trainpipe reads the metadata with an unpickler that
admits only DCP's own metadata classes, torch's sizes, dtypes and layouts and a path, and the items
with ``weights_only=True``: a foreign or crafted checkpoint is refused (and skipped as unreadable),
never executed. Imports torch.
"""

from __future__ import annotations

import io
import pickle
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

_DCP = "torch.distributed.checkpoint."
_ALLOWED = {
    ("torch.serialization", "_get_layout"),
    ("pathlib", "PosixPath"),
    ("pathlib", "PurePosixPath"),
    ("pathlib", "Path"),
    ("collections", "OrderedDict"),
    ("builtins", "set"),
    ("builtins", "frozenset"),
}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if module.startswith(_DCP):
            obj = super().find_class(module, name)
            if isinstance(obj, type) or type(obj).__name__ == "EnumType" or "MEM_FORMAT" in name:
                return obj
        elif module == "torch":
            obj = getattr(torch, name, None)
            if obj is torch.Size or isinstance(obj, (torch.dtype, torch.layout, torch.memory_format)):
                return obj
        elif (module, name) in _ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(
            f"checkpoint metadata names {module}.{name}, which a checkpoint's metadata does not hold"
        )


class SafeReader(FileSystemReader):
    """DCP's file reader with the metadata read by :class:`_MetadataUnpickler`."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
        from torch.distributed.checkpoint.metadata import StorageMeta

        rank = kwargs.get("rank")
        # torch 2.6 reads one ".metadata" (no per-rank metadata, no _get_metadata_path)
        where = (
            self._get_metadata_path(rank)
            if hasattr(self, "_get_metadata_path")
            else self.fs.concat_path(self.path, ".metadata")
        )
        with self.fs.create_stream(where, "rb") as fh:
            metadata = _MetadataUnpickler(fh).load()
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's load planner with non-tensor items read ``weights_only``."""

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        loaded = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            from torch.distributed.checkpoint._traverse import set_element  # what DefaultLoadPlanner itself uses

            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded
