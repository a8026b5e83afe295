"""A team's own code and data, as a new user writes them from the README: not the project's fixtures.

``acme`` is a churn team's package: a typed config in a module of its own (a nested model, a list, a free
mapping), a training function that owns its loop, and a model. With ``ACME_RECEIPTS`` set, the function first
writes what it received into that folder (the real runs the dry records are held to). The data is a
generated customer table (numeric and categorical-coded columns, a 0/1 label). A Feast repository folder
names a feature service. Every value the team writes is generated from a printed seed: nested mappings with
keys in no sorted order, integers past 2**53, floats written with exponents, unicode keys, empty containers.
"""

from __future__ import annotations

import json
import random
import textwrap
from pathlib import Path
from typing import Any

PACKAGE = "acme"
FUNCTION = "acme.churn.train:fit"

FILES = {
    "acme/__init__.py": "",
    "acme/churn/__init__.py": "",
    "acme/churn/settings.py": '''
        """Imports no framework: a DAG or a pipeline checks configs without torch."""
        from typing import Any

        from pydantic import BaseModel


        class Optimizer(BaseModel):
            momentum: float = 0.0
            nesterov: bool = False


        class ChurnConfig(BaseModel):
            lr: float
            optimizer: Optimizer = Optimizer()
            layers: list[int] = [12]
            tags: dict[str, Any] = {}
        ''',
    "acme/churn/train.py": """
        import json
        import os
        import time
        from pathlib import Path

        import torch

        from acme.churn.settings import ChurnConfig


        def receipt(ctx, config):
            \"\"\"What this call received, where ACME_RECEIPTS names a folder (the acceptance test's real runs).\"\"\"
            where = os.environ.get("ACME_RECEIPTS")
            if not where or ctx.rank != 0:
                return
            doc = {"output_dir": str(ctx.out), "train_config": ctx.settings.train_config,
                   "typed": {"type": type(config).__name__, "config": config.model_dump(mode="json")}}
            Path(where).mkdir(parents=True, exist_ok=True)
            path = Path(where) / f"{time.time_ns()}-{os.getpid()}.json"
            path.with_suffix(".tmp").write_text(json.dumps(doc))
            path.with_suffix(".tmp").replace(path)


        class ChurnNet(torch.nn.Module):
            def __init__(self, n_in: int, width: int, n_out: int):
                super().__init__()
                self.body = torch.nn.Sequential(
                    torch.nn.Linear(n_in, width), torch.nn.ReLU(), torch.nn.Linear(width, n_out)
                )

            def forward(self, x):
                return self.body(x)


        def fit(ctx, config: ChurnConfig):
            receipt(ctx, config)
            data = ctx.data.load()
            net = {"n_in": data.n_features, "width": config.layers[0], "n_out": data.n_outputs}
            model = ctx.prepare(ChurnNet(**net))
            opt = torch.optim.SGD(model.parameters(), lr=config.lr, momentum=config.optimizer.momentum)
            ctx.restore(model=model, optimizer=opt)
            for x, y in ctx.batches(data):
                loss = torch.nn.functional.cross_entropy(model(x), y)
                ctx.backward(loss)
                ctx.step(opt)
                ctx.log(churn_loss=loss)
            ctx.save_model(model, init_args=net)
        """,
}


def write_package(root: Path) -> Path:
    """The team's package under ``root`` (put ``root`` on PYTHONPATH); returns ``root``."""
    for rel, text in FILES.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip())
    return root


def write_table(path: Path, rows: int = 96, seed: int = 7) -> Path:
    """A customer table: tenure, spend, support calls, a plan code, and churned (0/1) from them."""
    rng = random.Random(seed)
    lines = ["customer_id,event_timestamp,tenure_months,monthly_spend,support_calls,plan,churned"]
    for i in range(rows):
        tenure, spend, calls, plan = (
            rng.randint(1, 72),
            round(rng.uniform(10, 120), 2),
            rng.randint(0, 9),
            rng.randint(0, 2),
        )
        churned = int(calls > 4 or (tenure < 12 and spend > 80))
        stamp = f"2026-03-{1 + i % 28:02d}T00:00:00+00:00"
        lines.append(f"{1000 + i},{stamp},{tenure},{spend},{calls},{plan},{churned}")
    path.write_text("\n".join(lines) + "\n")
    return path


def write_feature_repo(root: Path) -> Path:
    """A Feast repository folder (its feature_store.yaml; nothing applied: a dry run reads no features)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "feature_store.yaml").write_text(
        "project: acme\nregistry: data/registry.db\nprovider: local\nonline_store:\n  type: sqlite\n"
        "entity_key_serialization_version: 3\n"
    )
    return root


def _scalar(rng: random.Random) -> Any:
    return rng.choice(
        [
            rng.randint(-(2**63), 2**63),
            2**53 + rng.randint(1, 1000),
            float(f"{rng.randint(1, 9)}e-{rng.randint(5, 12)}"),
            rng.uniform(-1e6, 1e6),
            rng.choice([True, False, None]),
            rng.choice(["", "é", "naïve", "日本", "a b", "0.10", "1e5", "yes", "2026-01-01"]),
        ]
    )


def _key(rng: random.Random) -> str:
    return rng.choice(["zeta", "alpha", "Ωmega", "b", "a", "10", "9", "_x", "Ä", "key with space", "z1", "y"])


def nested(rng: random.Random, depth: int = 0) -> Any:
    """A JSON value of any shape a team might write, keys in no sorted order."""
    kind = rng.random()
    if depth >= 3 or kind < 0.4:
        return _scalar(rng)
    if kind < 0.55:
        return [nested(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    out: dict[str, Any] = {}
    for _ in range(rng.randint(0, 4)):
        out[_key(rng) + str(len(out))] = nested(rng, depth + 1)
    return dict(reversed(list(out.items()))) if rng.random() < 0.5 else out


def train_config(seed: int) -> dict[str, Any]:
    """The team's train_config: typed fields, and under ``tags`` generated values of every shape."""
    rng = random.Random(seed)
    tags = {f"{_key(rng)}-{i}": nested(rng) for i in range(6)}
    return {"optimizer": {"nesterov": False, "momentum": 0.5}, "tags": tags, "lr": 0.05, "layers": [8]}


def same_order(a: Any, b: Any) -> bool:
    """Equal, with every mapping's keys in the same order at every level."""
    return json.dumps(a) == json.dumps(b)
