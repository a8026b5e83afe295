"""The docs' example blocks, as Sybil regions, and how each kind is evaluated.

A fenced block with a language is an example (an untagged block, ``text`` or ``console`` is output shown, not
an example). Comments directly above a block say more about it:

- ``<!-- not run: REASON -->``: the block cannot run here (a cluster, a KFP API server); it is still checked
  statically (Python compiles, YAML loads as its kind, a command's flags exist), never silently skipped;
- ``<!-- example: KIND -->``: what a YAML block is, where its keys do not say (:data:`YAML_KINDS`).

Each kind runs as a user would run it, in the document's scratch folder (:mod:`tests.docs.workspace`):

- ``python``: executed as written. A block whose first line is a comment naming a file (``# mypkg/train.py``;
  several files in one block, each from its own such line) is written there instead, before the document's
  first example runs, and compiled at its turn. A block that imports no trainpipe runs in a fresh interpreter
  and must leave trainpipe unimported (what it shows works without trainpipe); the others run in this process.
  Every KFP pipeline a block defines is compiled, and a block that defines an Airflow DAG is loaded by
  Airflow's DagBag (the DAG exists, its tasks built).
- ``yaml``: a pipeline-config fragment is laid over a small base config and must load
  (``load_pipeline_config``), compile (``trainpipe compile --config``) and build the training DAG; a hardware
  profile, a policy, train_model settings, a ``cluster`` or a ``slurm`` section goes through its own loader.
- ``sh`` / ``bash``: each command (``\\`` continuations and quoted newlines joined) is one example, run by bash
  with the venv's ``bin`` first on ``PATH``; it must exit 0.
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sybil import Region
from sybil.parsers.markdown.lexers import RawFencedCodeBlockLexer

REPO = Path(__file__).resolve().parents[2]
#: Fenced blocks that show output, not an example.
NOT_EXAMPLES = ("", "text", "console", "output")
COMMENT = re.compile(r"^\s*<!--\s*(not run|example)\s*:\s*(.*?)\s*-->\s*$")
FILE_LINE = re.compile(r"^# ([\w./-]+\.py)\b(?::.*)?$")
LEXER = RawFencedCodeBlockLexer(info_pattern=re.compile(r"(?P<language>[^\n]*)$\n", re.MULTILINE))


class ExampleFailed(AssertionError):
    """An example did not do what its document says."""


@dataclass
class Block:
    """One example: a whole Python or YAML block, or one command of a shell block."""

    doc: str  #: the document, relative to the repository
    line: int  #: the example's first line in the document
    language: str
    source: str
    not_run: str | None = None  #: why it cannot run here (checked statically instead)
    kind: str | None = None  #: a YAML block's kind, when a comment names it
    files: dict[str, str] = field(default_factory=dict)  #: a file block's files: path -> content

    @property
    def tier(self) -> str:
        """``integration`` for what runs a command or a model, ``contract`` for what only compiles or loads."""
        if self.not_run or self.language == "yaml" or self.files:
            return "contract"
        if self.language == "python" and (_defines_pipeline(self.source) or _defines_dag(self.source)):
            return "contract"
        return "integration"


def _directives(text: str, fence_start: int) -> dict[str, str]:
    """The ``<!-- not run: ... -->`` and ``<!-- example: ... -->`` comments directly above a fence."""
    found: dict[str, str] = {}
    for line in reversed(text[:fence_start].splitlines()):
        if not line.strip():
            continue
        m = COMMENT.match(line)
        if not m:
            break
        found.setdefault(m.group(1), m.group(2))
    return found


def split_files(source: str) -> dict[str, str]:
    """A file block's files (path -> content), or {} when the block's first line names no file."""
    files: dict[str, list[str]] = {}
    current = None
    for i, line in enumerate(source.splitlines(keepends=True)):
        m = FILE_LINE.match(line.rstrip("\n"))
        if m and (i == 0 or current is not None):
            current = m.group(1)
            files[current] = []
        elif current is None:
            return {}
        files[current].append(line)
    return {path: "".join(lines).strip("\n") + "\n" for path, lines in files.items()}


def split_commands(source: str) -> list[tuple[int, int, str]]:
    """Each command of a shell block: (start, end) in ``source`` and its text. A command goes on over ``\\``
    line ends and over newlines inside quotes; blank and comment-only lines are not commands."""
    out = []
    start = None
    pos = 0
    for line in source.splitlines(keepends=True):
        if start is None and (not line.strip() or line.lstrip().startswith("#")):
            pos += len(line)
            continue
        start = pos if start is None else start
        pos += len(line)
        text = source[start:pos]
        if text.rstrip("\n").endswith("\\"):
            continue
        try:
            shlex.split(text, comments=True)
        except ValueError:  # an open quote: the command goes on
            continue
        out.append((start, start + len(text.rstrip("\n")), text.strip()))
        start = None
    if start is not None:
        out.append((start, len(source.rstrip("\n")), source[start:].strip()))
    return out


def parse(document: Any) -> Any:
    """Sybil parser: every fenced block of a document with a language, as its examples."""
    path = Path(document.path).resolve()
    doc = path.relative_to(REPO).as_posix() if path.is_relative_to(REPO) else str(path)
    for region in LEXER(document):
        language = region.lexemes["language"].strip().lower()
        if language in NOT_EXAMPLES:
            continue
        source = region.lexemes["source"]
        said = _directives(document.text, region.start)
        first_line = document.text.count("\n", 0, region.start) + 2
        common = {"doc": doc, "language": language, "not_run": said.get("not run"), "kind": said.get("example")}
        if language in ("sh", "bash", "shell"):
            body = region.start + source.offset
            for start, end, command in split_commands(str(source)):
                line = first_line + str(source).count("\n", 0, start)
                yield Region(body + start, body + end, Block(line=line, source=command, **common), evaluate)
        else:
            block = Block(line=first_line, source=str(source), **common)
            if language == "python":
                block.files = split_files(block.source)
            yield Region(region.start, region.end, block, evaluate)


def evaluate(example: Any) -> None:
    """Sybil evaluator: the example's kind decides (the module's docstring)."""
    block: Block = example.parsed
    scratch = example.namespace["doc_env"].scratch_for(example)
    if block.language == "python":
        static_python(block) if block.not_run else run_python(block, scratch)
    elif block.language == "yaml":
        check_yaml(block, scratch, static=bool(block.not_run))
    elif block.language in ("sh", "bash", "shell"):
        static_command(block.source) if block.not_run else run_command(block.source, scratch)
    else:
        raise ExampleFailed(
            f"{block.doc}:{block.line}: no evaluator for ```{block.language} blocks: use python, yaml or sh, or say "
            "why it cannot run with <!-- not run: REASON --> before it"
        )


# --- python ---------------------------------------------------------------------------------------------------


def _imports(source: str) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


def _defines_pipeline(source: str) -> bool:
    return "kfp" in _imports(source) and "pipeline" in source


def _defines_dag(source: str) -> bool:
    return "airflow" in _imports(source) and re.search(r"\bDAG\(", source) is not None


def static_python(block: Block) -> None:
    """A block that cannot run here still compiles (each file of a file block too)."""
    for name, code in (block.files or {f"{block.doc}:{block.line}": block.source}).items():
        compile(code, name, "exec", dont_inherit=True)


#: Appended to a block run in a fresh interpreter: its pipelines compiled, and trainpipe never imported.
FRESH_EPILOGUE = """
import sys as _sys
from pathlib import Path as _Path
try:
    from kfp.dsl.graph_component import GraphComponent as _G
except ImportError:
    _G = ()
for _name, _obj in list(globals().items()):
    if _G and isinstance(_obj, _G):
        from kfp import compiler as _compiler
        _compiler.Compiler().compile(_obj, str(_Path("compiled") / f"{_name}.yaml"))
        print("compiled", _name)
_loaded = sorted(m for m in _sys.modules if m == "trainpipe" or m.startswith("trainpipe."))
assert not _loaded, f"the example shows code that needs no trainpipe, but running it imported {_loaded[:3]}"
"""


def run_python(block: Block, scratch: Any) -> None:
    """Run a Python block as the module's docstring says."""
    if block.files:
        return static_python(block)  # written before the document's first example (Scratch.write_files)
    scratch.provide(
        [n.value for n in ast.walk(ast.parse(block.source)) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    )
    if "trainpipe" not in _imports(block.source):
        script = scratch.path / f"example_{block.line}.py"
        script.write_text(block.source + "\n" + FRESH_EPILOGUE)
        (scratch.path / "compiled").mkdir(exist_ok=True)
        proc = subprocess.run(
            [sys.executable, script.name],
            cwd=scratch.path,
            env=scratch.env(),
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        if proc.returncode != 0:
            raise ExampleFailed(
                f"{block.doc}:{block.line}: the example failed (exit {proc.returncode}):\n"
                + (proc.stdout[-1500:] + proc.stderr[-3000:])
            )
        if _defines_pipeline(block.source) and "compiled" not in proc.stdout:
            raise ExampleFailed(f"{block.doc}:{block.line}: the example defines no KFP pipeline to compile")
        return
    if _defines_dag(block.source):
        return load_dags(scratch.path / f"example_{block.line}_dag.py", block, scratch)
    namespace: dict[str, Any] = {"__name__": f"doc_example_{block.line}"}
    with scratch.inside():
        exec(compile(block.source, f"{block.doc}:{block.line}", "exec", dont_inherit=True), namespace)
        compiled = compile_pipelines(namespace, scratch.path / "compiled")
    if _defines_pipeline(block.source) and not compiled:
        raise ExampleFailed(f"{block.doc}:{block.line}: the example defines no KFP pipeline to compile")


def compile_pipelines(namespace: dict[str, Any], where: Path) -> list[Path]:
    """Compile every KFP pipeline in ``namespace`` with the KFP compiler."""
    from kfp import compiler
    from kfp.dsl.graph_component import GraphComponent

    out = []
    where.mkdir(exist_ok=True)
    for name, obj in list(namespace.items()):
        if isinstance(obj, GraphComponent):
            out.append(where / f"{name}.yaml")
            compiler.Compiler().compile(obj, str(out[-1]))
    return out


def load_dags(path: Path, block: Block | None, scratch: Any, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Load a DAG file with Airflow's DagBag, in this process, as the dag-processor would: no import error, and
    each DAG with its tasks built."""
    if block is not None:
        path.write_text(block.source)
    with scratch.inside(env):
        from airflow.dag_processing.dagbag import DagBag

        bag = DagBag(str(path))
    where = f"{block.doc}:{block.line}" if block else str(path)
    if bag.import_errors:
        raise ExampleFailed(f"{where}: Airflow cannot load the DAG: " + "; ".join(bag.import_errors.values())[-3000:])
    if not bag.dags or not all(dag.tasks for dag in bag.dags.values()):
        raise ExampleFailed(f"{where}: no DAG with tasks: {sorted(bag.dags)}")
    return bag.dags


# --- yaml ------------------------------------------------------------------------------------------------------


def _models() -> dict[str, Any]:
    from trainpipe.contract.policy import Policy
    from trainpipe.pipelines.config import PipelineConfig
    from trainpipe.services.profiles import HardwareProfile
    from trainpipe.training.settings import ClusterJob, SlurmJob, TrainModelParams

    return {
        "pipeline": PipelineConfig,
        "policy": Policy,
        "profile": HardwareProfile,
        "train": TrainModelParams,
        "cluster": ClusterJob,
        "slurm": SlurmJob,
    }


#: The kinds a YAML block may be, in the order they are tried on its keys.
YAML_KINDS = ("pipeline", "policy", "profile", "train", "cluster", "slurm")
#: What a pipeline-config fragment is laid over: the smallest config that runs (tiny data in the scratch folder).
BASE_CONFIG = {"data": "raw.csv", "workspace": "ws", "tracking_uri": "sqlite:///ws/mlflow.db"}


def yaml_kind(block: Block, data: dict[str, Any]) -> str:
    if block.kind:
        if block.kind not in YAML_KINDS:
            raise ExampleFailed(
                f"{block.doc}:{block.line}: unknown example kind {block.kind!r} ({', '.join(YAML_KINDS)})"
            )
        return block.kind
    models = _models()
    for kind in YAML_KINDS:
        if set(data) <= set(models[kind].model_fields):
            return kind
    raise ExampleFailed(
        f"{block.doc}:{block.line}: no kind of YAML example takes the keys {sorted(data)}: add "
        f"<!-- example: KIND --> before the block (KIND: {', '.join(YAML_KINDS)})"
    )


def _laid_over(base: dict[str, Any], fragment: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in fragment.items():
        both = isinstance(value, dict) and isinstance(base.get(key), dict)
        out[key] = _laid_over(base[key], value) if both else value
    return out


def check_yaml(block: Block, scratch: Any, static: bool = False) -> None:
    """Load a YAML block as its kind; a pipeline config (unless ``static``) also compiles and builds the DAG."""
    from trainpipe.contract.config import build, dump_yaml, parse_yaml
    from trainpipe.contract.errors import TrainpipeError

    where = f"{block.doc}:{block.line}"
    data = parse_yaml(block.source)
    if not isinstance(data, dict):
        raise ExampleFailed(f"{where}: the block is not a YAML mapping")
    kind = yaml_kind(block, data)
    path = scratch.path / f"example_{block.line}.yaml"
    try:
        with scratch.inside():
            if kind == "pipeline":
                path.write_text(dump_yaml(_laid_over(BASE_CONFIG, data)))
                from trainpipe.pipelines.config import load_pipeline_config

                load_pipeline_config(path)
                if not static:
                    compile_config(path, where)
                    load_dags(REPO / "dags" / "training_dag.py", None, scratch, {"TRAINPIPE_CONFIG": str(path)})
            elif kind in ("policy", "profile"):
                path.write_text(block.source)
                from trainpipe.contract.policy import load_policy
                from trainpipe.services.profiles import get_profile

                (load_policy if kind == "policy" else get_profile)(str(path))
            else:
                build(_models()[kind], data, where=kind)
    except TrainpipeError as exc:
        raise ExampleFailed(f"{where}: the {kind} example is refused: {exc}") from None


def compile_config(path: Path, where: str) -> None:
    """``trainpipe compile --config PATH`` in this process."""
    from typer.testing import CliRunner

    from trainpipe.app.cli import app

    result = CliRunner().invoke(app, ["compile", "--config", str(path), "-o", str(path.with_suffix(".kfp.yaml"))])
    if result.exit_code != 0:
        raise ExampleFailed(f"{where}: trainpipe compile refused the config (exit {result.exit_code}): {result.output}")


# --- shell -----------------------------------------------------------------------------------------------------


def run_command(command: str, scratch: Any) -> None:
    """Run one command in the scratch folder; it must exit 0."""
    scratch.provide(shlex.split(command, comments=True))
    proc = subprocess.run(
        ["bash", "-o", "pipefail", "-c", command],
        cwd=scratch.path,
        env=scratch.env(),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if proc.returncode != 0:
        raise ExampleFailed(
            f"`{command}` exited {proc.returncode} in {scratch.path}:\n{proc.stdout[-1500:]}{proc.stderr[-3000:]}"
        )


def static_command(command: str) -> None:
    """What can be known of a command without running it: bash parses it, and a trainpipe command's
    subcommand and flags exist (a component's from its spec), a ``make`` target is in the Makefile."""
    proc = subprocess.run(["bash", "-n", "-c", command], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise ExampleFailed(f"`{command}` does not parse: {proc.stderr.strip()}")
    words = shlex.split(command, comments=True)
    for segment in _segments(words):
        _check_segment(command, segment)


def _segments(words: list[str]) -> list[list[str]]:
    out: list[list[str]] = [[]]
    for word in words:
        if word in ("|", "&&", "||", ";", "&"):
            out.append([])
        else:
            out[-1].append(word)
    return [s for s in out if s]


def _flags(words: list[str]) -> list[str]:
    return [w.split("=", 1)[0] for w in words if re.match(r"--[a-z]", w)]


def _check_segment(command: str, words: list[str]) -> None:
    if words[:2] == ["python", "-m"] and words[2].startswith("trainpipe.components."):
        known = component_flags(words[2].rsplit(".", 1)[1])
        unknown = [f for f in _flags(words[3:]) if f not in known]
        if unknown:
            raise ExampleFailed(f"`{command}`: {words[2]} has no {', '.join(unknown)}")
        for value in words[3:]:
            if value[:1] in "[{":
                try:
                    json.loads(value)
                except ValueError as exc:
                    raise ExampleFailed(f"`{command}`: {value[:40]}… is not JSON: {exc}") from None
    elif words[0] == "trainpipe":
        _check_cli(command, words[1:])
    elif words[0] == "make":
        targets = set(re.findall(r"^([\w-]+)\s*:", (REPO / "Makefile").read_text(), re.M))
        missing = [w for w in words[1:] if "=" not in w and not w.startswith("-") and w not in targets]
        if missing:
            raise ExampleFailed(f"`{command}`: the Makefile has no target {', '.join(missing)}")


def component_flags(component: str) -> set[str]:
    """Every flag of ``python -m trainpipe.components.<component>`` (its parser, built from its spec)."""
    from trainpipe.contract.entrypoint import make_parser

    spec = __import__(f"trainpipe.components.{component}.spec", fromlist=["x"])
    config = getattr(spec, "".join(p.title() for p in component.split("_")) + "Config")
    return {opt for action in make_parser(component, config, "")._actions for opt in action.option_strings}


def _check_cli(command: str, words: list[str]) -> None:
    import typer.main

    from trainpipe.app.cli import app

    cmd = typer.main.get_command(app)
    while words and hasattr(cmd, "commands") and words[0] in cmd.commands:
        cmd, words = cmd.commands[words[0]], words[1:]
    if hasattr(cmd, "commands"):
        raise ExampleFailed(f"`{command}`: trainpipe has no command {words[:1]}")
    known = {opt for param in cmd.params for opt in (*param.opts, *param.secondary_opts)} | {"--help"}
    unknown = [f for f in _flags(words) if f not in known]
    if unknown:
        raise ExampleFailed(f"`{command}`: trainpipe {cmd.name} has no {', '.join(unknown)}")


@contextlib.contextmanager
def environ(values: dict[str, str]):
    """``os.environ`` with ``values`` set, put back afterwards."""
    before = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
