"""Outputs written atomically (mkstemp, then rename) take the mode a plain open() would: 0666 less the umask, not
mkstemp's 0600 that other users of a shared volume cannot read."""

from __future__ import annotations

import os
import stat

import pytest

from trainpipe.contract.io import atomic_copy, atomic_write_json, atomic_write_text

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("umask", [0o022, 0o027, 0o077])
def test_atomic_writes_honour_the_umask(tmp_path, umask):
    before = os.umask(umask)
    try:
        written = [
            atomic_write_text(tmp_path / "a.txt", "a"),
            atomic_write_json(tmp_path / "b.json", {"b": 1}),
            atomic_copy(tmp_path / "a.txt", tmp_path / "c.txt"),
        ]
    finally:
        os.umask(before)
    assert {oct(stat.S_IMODE(p.stat().st_mode)) for p in written} == {oct(0o666 & ~umask)}


@pytest.mark.parametrize(
    ("before", "setting", "after"), [(0o022, "027", 0o027), (0o077, "027", 0o077), (0o022, "022", 0o022)]
)
def test_a_step_restricts_the_umask_to_its_policys_and_never_loosens_a_stricter_one(before, setting, after):
    from trainpipe.contract.io import restrict_umask

    outer = os.umask(before)
    try:
        assert restrict_umask(setting) == before
        assert os.umask(before) == after
    finally:
        os.umask(outer)
