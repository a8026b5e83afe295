"""The docs' examples harness itself: what it takes for an example, and what it refuses, in process."""

from __future__ import annotations

import pytest
from sybil import Document

from tests.docs.examples import Block, ExampleFailed, parse, split_files, static_command, yaml_kind

pytestmark = pytest.mark.unit

DOC = """# A page

```
output shown, not an example
```

```text
neither
```

<!-- not run: needs a cluster -->

```sh
# a comment line is no command
python -m trainpipe.components.tune_model --data snapshot/ --output-dir tune/ \\
  --space '{"batch_size": {"type": "categorical",
            "choices": [32, 64]}}' --n-trials 4
trainpipe compile -o p.yaml   # two commands
```

<!-- example: policy -->
```yaml
allowed_regions: [me-central-1]
```

```python
# mypkg/config.py: no framework
X = 1

# mypkg/train.py
from mypkg.config import X
```
"""


def test_each_block_with_a_language_is_an_example_each_command_its_own(tmp_path):
    (tmp_path / "page.md").write_text(DOC)
    blocks: list[Block] = [r.parsed for _, r in Document.parse(str(tmp_path / "page.md"), parse).regions]
    assert [(b.language, b.line, b.not_run, b.kind, b.tier) for b in blocks] == [
        ("sh", 15, "needs a cluster", None, "contract"),
        ("sh", 18, "needs a cluster", None, "contract"),
        ("yaml", 23, None, "policy", "contract"),
        ("python", 27, None, None, "contract"),
    ]
    assert blocks[0].source.endswith("--n-trials 4") and '\n            "choices"' in blocks[0].source
    assert blocks[1].source == "trainpipe compile -o p.yaml   # two commands"
    assert split_files(blocks[3].source) == {
        "mypkg/config.py": "# mypkg/config.py: no framework\nX = 1\n",
        "mypkg/train.py": "# mypkg/train.py\nfrom mypkg.config import X\n",
    }
    assert split_files("import torch\n# mypkg/train.py\n") == {}  # a block that names no file first is code


@pytest.mark.parametrize(
    ("command", "wrong"),
    [
        ("python -m trainpipe.components.train_model --data d --epochz 3", "train_model has no --epochz"),
        ("python -m trainpipe.components.tune_model --space '{\"lr\": 1,}'", "is not JSON"),
        ("trainpipe upload --hots https://kfp.example.com --package p.yaml", "trainpipe upload has no --hots"),
        ("trainpipe compiles -o p.yaml", "trainpipe has no command ['compiles']"),
        ("make demo-everything", "the Makefile has no target demo-everything"),
        ("python -m trainpipe.components.train_model --data 'd", "does not parse"),
    ],
)
def test_a_marked_command_is_still_checked(command, wrong):
    with pytest.raises(ExampleFailed, match=wrong.replace("[", r"\[").replace("]", r"\]")):
        static_command(command)


def test_a_marked_command_that_is_right_passes():
    static_command("trainpipe upload --host https://kfp.example.com --package p.yaml --namespace team-a")
    static_command("python -m trainpipe.components.train_model --data d --output-dir o --slurm '{\"nnodes\": 4}'")
    static_command("make demo && make test")


def test_a_yaml_block_of_no_known_kind_says_how_to_name_it():
    block = Block(doc="docs/x.md", line=3, language="yaml", source="colour: blue\n")
    with pytest.raises(ExampleFailed, match=r"docs/x.md:3: .*add <!-- example: KIND --> before the block"):
        yaml_kind(block, {"colour": "blue"})
    assert yaml_kind(block, {"nnodes": 4, "cluster": {}}) == "train"
    assert yaml_kind(block, {"name": "p", "prices": {}}) == "profile"
    assert yaml_kind(block, {"train": {"epochs": 2}, "tune": None}) == "pipeline"


@pytest.mark.parametrize(
    ("command", "stages"),
    [
        ("python -m x --data raw.csv --output-dir out/validated", set()),  # its own output: nothing to copy
        ("python -m x --data out/snapshot --output-dir out/eval", {"outputs"}),
        ("python -m x --tracking-uri sqlite:///ws/mlflow.db", {"outputs"}),
        ("trainpipe lineage models:/my-model@champion", {"outputs"}),
        ("python -m x --data entities.csv --feature-repo=feature_repo/", {"feast"}),
    ],
)
def test_a_scratch_folder_copies_in_the_stages_its_example_names(tmp_path, command, stages):
    import shlex

    from tests.docs.workspace import PROVIDES, Scratch

    class Stages:
        built: set[str] = set()

        def stage(self, name):
            self.built.add(name)
            for path in PROVIDES[name]:
                (tmp_path / name / path).mkdir(parents=True, exist_ok=True)
            return tmp_path / name

    scratch = Scratch(tmp_path / "scratch", Stages())
    scratch.path.mkdir()
    scratch.provide(shlex.split(command))
    assert Stages.built == stages and {p.name for p in scratch.path.iterdir()} == {
        p for s in stages for p in PROVIDES[s]
    }
