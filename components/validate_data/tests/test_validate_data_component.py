"""validate_data's own tests: its contract (entrypoint, faces, folder) and its default suite on no data."""

from __future__ import annotations

import pytest

from tests.helpers.component_contract import ComponentContract
from trainpipe.components.validate_data.core import load_suite
from trainpipe.contract.errors import InputError


class TestValidateDataContract(ComponentContract):
    name = "validate_data"


@pytest.mark.unit
def test_default_suite_is_generic(tmp_path):
    suite = load_suite("builtin:default", "target")
    cols = {e["kwargs"].get("column") for e in suite["expectations"]}
    assert "target" in cols
    bad = tmp_path / "s.json"
    bad.write_text('{"name": "x", "expectations": []}')
    with pytest.raises(InputError, match="non-empty 'expectations'"):
        load_suite(str(bad), "y")
