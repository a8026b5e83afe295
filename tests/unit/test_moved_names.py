"""The library's modules live in folders by layer; each old, flat name keeps working for one release (a team's
import, a model pickled under it), with a DeprecationWarning that names the new one."""

from __future__ import annotations

import importlib
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

import trainpipe
from trainpipe.contract.moved import MOVED, new_name

pytestmark = pytest.mark.unit


def test_the_library_has_no_flat_modules_left():
    """Every library module lives in its layer's folder: the package's top holds only its ``__init__``."""
    root = Path(trainpipe.__file__).parent
    assert sorted(p.name for p in root.glob("*.py")) == ["__init__.py"]


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_name_is_the_moved_module_with_a_warning(old):
    new = importlib.import_module(MOVED[old])
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=rf"{old} moved to {MOVED[old]}"):
        module = importlib.import_module(old)
    assert module is new


def test_a_submodule_of_a_moved_package_follows_it():
    assert new_name("trainpipe.serving.loader") == "trainpipe.services.serving.loader"
    assert new_name("trainpipe.servingx") is None and new_name("trainpipe.contract.io") is None


def test_an_object_pickled_under_its_old_module_loads():
    """A class pickles by its module's name: what was saved before the move (here: rewritten to the old name)
    loads as the moved class."""
    from trainpipe.services.costs import Budget

    budget = Budget(max_cost=3.0, max_gpu_hours=None, prices=None)
    saved = pickle.dumps(budget, protocol=0).replace(b"trainpipe.services.costs", b"trainpipe.costs")
    assert b"trainpipe.costs\n" in saved
    sys.modules.pop("trainpipe.costs", None)  # as in a process that never imported it
    with pytest.warns(DeprecationWarning):
        assert pickle.loads(saved) == budget


def test_from_trainpipe_import_an_old_name_works_in_a_fresh_process():
    code = (
        "import warnings; warnings.simplefilter('error', DeprecationWarning)\n"
        "try:\n    from trainpipe import signing\nexcept DeprecationWarning as w:\n    print(w)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "trainpipe.signing moved to trainpipe.services.signing; the old name goes in the next release"
