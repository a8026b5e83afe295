"""What a label is, for every component that reads one: classes or values."""

from __future__ import annotations

from typing import Literal, get_args

#: ``classification``: the label holds classes; ``regression``: it holds numbers.
Task = Literal["classification", "regression"]
TASKS: tuple[str, ...] = get_args(Task)
