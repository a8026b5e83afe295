"""The artifact file names are spelled twice: in ``trainpipe.contract.layout`` (the bottom of the library's layers,
read by the writers and the readers) and in the loader every registered model carries (it travels without
trainpipe). Both spellings must stay one."""

from __future__ import annotations

import pytest

from trainpipe.contract import layout
from trainpipe.services.serving import loader

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("name", ["MODEL_FILE", "MODEL_META", "ONNX_FILE"])
def test_the_loader_and_the_layout_name_a_model_file_alike(name: str) -> None:
    assert getattr(loader, name) == getattr(layout, name)
