"""The README's reuse examples run as written, so they cannot rot."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.conftest import REPO

#: The reference pages the README links to.
DOCS = sorted((REPO / "docs").glob("*.md"))

pytestmark = pytest.mark.contract


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", (REPO / "README.md").read_text(), flags=re.S)


def test_kfp_example_compiles(tmp_path):
    (block,) = [b for b in _python_blocks() if "kfp_component import" in b]
    code = (
        block + f"\nfrom kfp import compiler\ncompiler.Compiler().compile(my_pipeline, {str(tmp_path / 'p.yaml')!r})\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "validate-data" in (tmp_path / "p.yaml").read_text()


def test_kfp_example_from_the_exported_spec_compiles(tmp_path):
    (block,) = [b for b in _python_blocks() if "load_component_from_file" in b]
    code = (
        block
        + f"\nfrom kfp import compiler\ncompiler.Compiler().compile(my_spec_pipeline, {str(tmp_path / 'p.yaml')!r})\n"
    )
    # run from the repository root (the README's relative path), in a process that imports no trainpipe
    proc = subprocess.run(
        [sys.executable, "-c", code + "import sys; assert 'trainpipe' not in sys.modules\n"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "validate-data" in (tmp_path / "p.yaml").read_text()


def test_airflow_example_builds_the_operator(tmp_path):
    (block,) = [b for b in _python_blocks() if "airflow" in b]
    code = (
        block
        + "\nfrom airflow.sdk import DAG\nt = TrainModelOperator.__mro__\nprint('ok', [x.__name__ for x in t][:2])\n"
    )
    env = {**os.environ, "AIRFLOW_HOME": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "ok ['TrainModelOperator', 'TrainpipeOperator']" in proc.stdout


def _commands() -> list[tuple[str, str, list[str]]]:
    """Every `python -m trainpipe.components.<name> ...` command in the READMEs and docs: (file, component, flags)."""
    found = []
    for readme in [REPO / "README.md", *sorted((REPO / "components").glob("*/README.md")), *DOCS]:
        text = readme.read_text().replace("\\\n", " ")
        for block in re.findall(r"```sh\n(.*?)```", text, flags=re.S):
            for line in block.splitlines():
                m = re.search(r"python -m trainpipe\.components\.(\w+)(.*)", line.split("#")[0])
                if m:
                    found.append(
                        (str(readme.relative_to(REPO)), m.group(1), re.findall(r"(?<!\S)--[a-z][a-z-]*", m.group(2)))
                    )
    return found


def test_every_component_command_in_the_readmes_uses_settings_the_component_has():
    from trainpipe.contract.entrypoint import make_parser

    commands = _commands()
    assert {c for _, c, _ in commands} >= {
        "validate_data",
        "snapshot_dataset",
        "train_model",
        "profile_training",
        "evaluate_model",
        "register_model",
    }
    for where, component, flags in commands:
        spec = __import__(f"trainpipe.components.{component}.spec", fromlist=["x"])
        config = getattr(spec, "".join(p.title() for p in component.split("_")) + "Config")
        known = {opt for action in make_parser(component, config, "")._actions for opt in action.option_strings}
        unknown = [f for f in flags if f not in known]
        assert unknown == [], f"{where}: {component} has no {unknown}"


def test_the_documented_config_is_a_valid_pipeline_config(tmp_path):
    import yaml

    from trainpipe.pipelines.config import load_pipeline_config

    (block,) = [
        b
        for b in re.findall(r"```yaml\n(.*?)```", (REPO / "docs" / "configuration.md").read_text(), flags=re.S)
        if "workspace:" in b
    ]
    path = tmp_path / "pipeline.yaml"
    path.write_text(block)
    cfg = load_pipeline_config(path)
    assert cfg.train.train_function and yaml.safe_load(block)["train"]["train_config"] == cfg.train.train_config


def test_the_components_table_lists_trainpipe_components_in_their_order():
    """The README names the components from one list: its table is ``trainpipe.COMPONENTS``."""
    import re

    from trainpipe import COMPONENTS

    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text.split("## The components", 1)[1].split("\n## ", 1)[0]
    assert tuple(re.findall(r"^\| `([a-z_]+)` \| ", section, re.M)) == COMPONENTS
    for name in COMPONENTS:  # and each component's own README is linked from its row
        assert f"(components/{name}/README.md)" in section


def test_every_reference_page_is_linked_from_the_readme_and_every_link_resolves():
    """The README keeps the overview, the two commands and the components; the reference lives under docs/,
    each page linked from it. A relative link that names no file is a broken promise to the reader."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert DOCS and all(f"](docs/{page.name})" in readme for page in DOCS), [p.name for p in DOCS]
    for page in [REPO / "README.md", *DOCS, *sorted((REPO / "components").glob("*/README.md"))]:
        for target in re.findall(r"\]\((?!https?://|#|mailto:)([^)#]+)", page.read_text(encoding="utf-8")):
            assert (page.parent / target).exists(), f"{page.relative_to(REPO)} links to {target}, which is not there"
