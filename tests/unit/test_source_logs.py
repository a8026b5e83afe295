"""What a team function logs each epoch, read from its source (trainpipe.training.source_logs): the names
are said only where every ``ctx.log`` call names them with literal keywords and ``ctx`` goes nowhere else;
any other shape is "not known before it runs" (None), never a guess. Team functions of generated shapes,
written as a team's module in a folder of their own; some are run with a recording context to hold the
names said to what a call actually records."""

from __future__ import annotations

import importlib
import itertools
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainpipe.training.source_logs import epoch_logs

pytestmark = pytest.mark.unit

_COUNTER = itertools.count()

#: Statements whose names the source says: (statement, names it can log).
CERTAIN = [
    ("ctx.log(loss=1.0)", {"loss"}),
    ("ctx.log(val_loss=0.5, acc=0.9)", {"val_loss", "acc"}),
    ("if ctx.is_chief:\n    ctx.log(chief_only=1.0)", {"chief_only"}),
    ("for x in ctx.batches([1, 2]):\n    ctx.log(batch_mean=float(x))", {"batch_mean"}),
    ("def inner(v):\n    ctx.log(inner_value=v)\ninner(2.0)", {"inner_value"}),
    ("ctx.restore(model=object())", set()),
    ("n = ctx.data.n_rows", set()),
    ("ctx.log()", set()),
]
#: Statements that make the names uncertain: ctx handed on, renamed, or logged under names only a run knows.
UNCERTAIN = [
    "ctx.log(**{'hidden': 1.0})",
    "values = {'dyn': 2.0}\nctx.log(**values)",
    "ctx.log({'positional': 1.0})",
    "helper(ctx)",
    "c = ctx\nc.log(renamed=1.0)",
    "log = ctx.log\nlog(bound=1.0)",
    "ctx.metrics.log({'direct': 1.0})",
    "getattr(ctx, 'log')(by_name=1.0)",
    "kwargs = locals()\nhelper(**kwargs)",
    "ctx = ctx\nctx.log(rebound=1.0)",
    "ctx._hidden = 1",
]


def _team_module(root: Path, source: str) -> str:
    """A team package's module holding ``source``, importable from ``root``; its ``module:function`` spec."""
    name = f"teamgen{next(_COUNTER)}"
    (root / name).mkdir()
    (root / name / "__init__.py").write_text("", encoding="utf-8")
    (root / name / "train.py").write_text(source, encoding="utf-8")
    importlib.invalidate_caches()
    return f"{name}.train:train"


def _function(statements: list[str], params: str = "ctx, config") -> str:
    body = "\n".join(textwrap.indent(s, "    ") for s in statements) or "    pass"
    return (
        "def helper(ctx=None, **kw):\n    if ctx is not None:\n        ctx.log(from_helper=1.0)\n\n\n"
        f"def train({params}):\n{body}\n"
    )


class _Recorder:
    """What a function's ctx calls record, with the few attributes the generated statements read."""

    is_chief = True

    def __init__(self) -> None:
        self.logged: set[str] = set()
        self.data = type("Data", (), {"n_rows": 2})()
        self.metrics = self

    def log(self, *args: Any, **values: Any) -> None:
        for arg in args:
            self.logged |= set(arg)
        self.logged |= set(values)

    def batches(self, source: Any) -> Any:
        return iter(source)

    def restore(self, **objects: Any) -> int:
        return 0


@pytest.fixture(scope="module")
def team_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("teams")
    sys.path.insert(0, str(root))
    yield root
    sys.path.remove(str(root))


@settings(max_examples=60, deadline=None)
@given(
    certain=st.lists(st.sampled_from(CERTAIN), max_size=4),
    uncertain=st.lists(st.sampled_from(UNCERTAIN), max_size=2),
    ctx_name=st.sampled_from(["ctx", "context", "c"]),
    seed=st.randoms(use_true_random=False),
)
def test_the_names_are_said_only_where_the_source_says_them_all(team_root, certain, uncertain, ctx_name, seed):
    statements = [s for s, _ in certain] + list(uncertain)
    seed.shuffle(statements)
    statements = [s.replace("ctx", ctx_name) for s in statements]
    spec = _team_module(team_root, _function(statements, params=f"{ctx_name}, config"))
    said = epoch_logs(spec)
    if uncertain:
        assert said is None, (statements, said)
        return
    expected = set().union(*(names for _, names in certain)) if certain else set()
    assert said == tuple(sorted(expected)), (statements, said)
    # what a run records is within what was said (each statement runs here)
    module = importlib.import_module(spec.partition(":")[0])
    ctx = _Recorder()
    module.train(ctx, {})
    assert ctx.logged <= set(said), (statements, said, ctx.logged)


@pytest.mark.parametrize(
    "source",
    [
        "import functools\n\n\n@functools.lru_cache\ndef train(ctx, config):\n    ctx.log(loss=1.0)\n",
        "def train(ctx, config):\n    ctx.log(loss=1.0)\n\n\ntrain = wrap(train)\n",
        "def train(ctx, config):\n    ctx.log(loss=1.0)\n\n\ndef train(ctx, config):\n    ctx.log(acc=1.0)\n",
        "def train(*args):\n    args[0].log(loss=1.0)\n",
        "from elsewhere import train\n",
        "class train:\n    def __init__(self, ctx, config):\n        ctx.log(loss=1.0)\n",
        "def train(ctx, config):\n    ctx.log(loss=1.0)\n\n\nfrom elsewhere import *\n",
        "def train(ctx, config):\n    exec('ctx.log(hidden=1.0)')\n",
        "def train(ctx, config:\n",  # a syntax error: the run tells
    ],
    ids=[
        "decorated",
        "rebound",
        "defined twice",
        "no ctx parameter",
        "imported",
        "a class",
        "star import",
        "exec",
        "unreadable",
    ],
)
def test_a_function_the_source_cannot_pin_down_is_not_known_before_it_runs(team_root, source):
    assert epoch_logs(_team_module(team_root, source)) is None


def test_a_module_that_is_not_here_or_a_function_spec_without_one_says_nothing(team_root):
    assert epoch_logs("nosuchteampkg.train:train") is None
    assert epoch_logs("builtin:mlp") is None
    assert epoch_logs(_team_module(team_root, "def other(ctx, config):\n    ctx.log(loss=1.0)\n")) is None


def test_a_function_that_never_logs_logs_nothing(team_root):
    spec = _team_module(team_root, "def train(ctx, config):\n    ctx.restore(model=1)\n")
    assert epoch_logs(spec) == ()
