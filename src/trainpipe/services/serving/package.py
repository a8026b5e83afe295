"""Write a trained model as an MLflow pyfunc model that loads without trainpipe, and load a model
artifact on trainpipe's side (weights only, a team's code only where the platform trusts it).

The MLflow model holds the weights-only artifact (``model.safetensors`` + ``model.json``), the
loader and the built-in networks as the code path ``trainpipe_pyfunc``, and, for a team's model,
the team's own package beside it. Nothing is pickled. mlflow is imported inside the functions.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trainpipe.contract.errors import InputError
from trainpipe.services.serving import loader

HERE = Path(__file__).resolve().parent
PYFUNC_FILE = HERE / "pyfunc_model.py"
ONNX_PYFUNC_FILE = HERE / "onnx_pyfunc.py"
#: Files of this package copied into every model as the code path ``trainpipe_pyfunc``.
SHIPPED = ("loader.py", "nets.py")
INPUT_EXAMPLE_FILE = "input_example.json"
OUTPUT_EXAMPLE_FILE = "output_example.json"
ARTIFACT_PATH = "model"
#: Where the weights-only artifact lies inside the MLflow model: ``artifacts/model/``.
WEIGHTS_DIR = "model"


def load_artifact(model_dir: str | Path, runtime: Any, field: str = "model") -> Any:
    """A model artifact loaded weights-only; a team's model code is imported only when the platform
    trusts its package (``runtime.trusted_code``, from ``TRAINPIPE_TRUSTED_MODEL_CODE``).

    Raises:
        InputError: the artifact is incomplete or foreign, its code untrusted, its weights unfit.
        SignatureInvalid: it carries a signature (``model.sig``) its files fail.
    """
    from trainpipe.contract.runtime import TRUSTED_CODE_ENV
    from trainpipe.services import signing

    if (
        Path(model_dir) / signing.SIGNATURE_FILE
    ).is_file():  # a signed model (a registered copy) is verified before it is read
        signing.verify(model_dir, field)
    try:
        return loader.load(model_dir, trusted=runtime.trusts)
    except loader.ModelError as exc:
        named = re.search(r"\('([A-Za-z_][\w.]*):", str(exc))
        package = named.group(1).split(".")[0] if named else "<its package>"
        hint = (
            f"; set this step's trusted_packages: [{package}] (a pipeline sets its train_function's package), or the "
            f"platform lists it in {TRUSTED_CODE_ENV}"
            if "not trusted here" in str(exc)
            else ""
        )
        raise InputError(f"{field}: {exc}{hint}") from None


def code_location(package: str) -> Path:
    """The folder (or single module file) of a top-level package, found without importing it.

    Raises:
        InputError: it cannot be found as a folder or file (it cannot travel with the model).
    """
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        raise InputError(
            f"save_model: the model's code package {package!r} cannot be found here, so it cannot travel with the model"
        )
    if spec.submodule_search_locations:
        locations = [Path(p) for p in spec.submodule_search_locations]
        if len(locations) != 1:
            raise InputError(
                f"save_model: the model's code package {package!r} spans {len(locations)} folders; give it one folder "
                "with an __init__.py"
            )
        return locations[0]
    if spec.origin and spec.origin.endswith(".py"):
        return Path(spec.origin)
    raise InputError(
        f"save_model: the model's code {package!r} is not Python source ({spec.origin}), so it cannot travel with the "
        "model"
    )


def stage_code(meta: dict[str, Any], dest: Path) -> list[str]:
    """Copy the loader (as ``trainpipe_pyfunc``) and every package ``meta["code"]`` names under ``dest``."""
    ours = dest / "trainpipe_pyfunc"
    ours.mkdir(parents=True)
    (ours / "__init__.py").write_text('"""trainpipe\'s model loader, shipped with the model."""\n', encoding="utf-8")
    for name in SHIPPED:
        shutil.copyfile(HERE / name, ours / name)
    paths = [str(ours)]
    for package in meta.get("code") or []:
        src = code_location(package)
        target = dest / src.name
        if src.is_dir():
            shutil.copytree(src, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copyfile(src, target)
        paths.append(str(target))
    return paths


def requirements(meta: dict[str, Any], extra: list[str] | None = None) -> list[str]:
    """What the model needs installed (mlflow adds itself): the versions trainpipe trained with."""
    from importlib.metadata import version

    pins = [
        f"torch=={version('torch').split('+')[0]}",
        f"safetensors=={version('safetensors')}",
        f"numpy=={version('numpy')}",
        f"pandas=={version('pandas')}",
    ]
    return pins + list(extra or [])


def log_model(run_id: str, model_dir: str | Path, extra_requirements: list[str] | None = None) -> str:
    """Log ``model_dir`` (a train_model output) as the MLflow pyfunc model of the run.

    MLflow 3's logged model, made with the client's own calls (create, upload, finalize, link to
    the run) rather than ``log_model``: ``log_model`` would load the model in this process to
    check the example, importing the framework. The training rank that saved the model already
    loaded the weights back through the same loader and predicted on the example.

    Returns:
        The logged model's URI, ``models:/<model id>``.
    """
    model_dir = Path(model_dir)
    meta = loader.read_meta(model_dir)
    return _log_pyfunc(
        run_id,
        model_dir,
        (loader.MODEL_FILE, loader.MODEL_META),
        PYFUNC_FILE,
        meta,
        requirements(meta, extra_requirements),
        name=ARTIFACT_PATH,
        model_type=f"trainpipe-{meta['task']}",
        tags={"trainpipe.builder": str(meta["builder"])},
        metadata={"trainpipe": {"builder": meta["builder"], "task": meta["task"]}},
    )


def log_onnx_model(run_id: str, model_dir: str | Path) -> str:
    """Log an optimized model (optimize_model's ``model/``: ``model.onnx`` + ``model.json``) as an MLflow
    pyfunc model of the training run; it loads with MLflow + onnxruntime, numpy and pandas alone.

    Returns:
        The logged model's URI, ``models:/<model id>``.
    """
    import json

    model_dir = Path(model_dir)
    meta = json.loads((model_dir / loader.MODEL_META).read_text(encoding="utf-8"))
    return _log_pyfunc(
        run_id,
        model_dir,
        (loader.ONNX_FILE, loader.MODEL_META),
        ONNX_PYFUNC_FILE,
        {},
        list(meta["requirements"]),
        name=f"{ARTIFACT_PATH}-{meta['variant']}",
        model_type=f"trainpipe-onnx-{meta['task']}",
        tags={"trainpipe.variant": str(meta["variant"])},
        metadata={"trainpipe": {"variant": meta["variant"], "task": meta["task"], "parent": meta.get("parent")}},
    )


def _log_pyfunc(
    run_id: str,
    model_dir: Path,
    files: tuple[str, ...],
    python_model: Path,
    meta: dict[str, Any],
    pip_requirements: list[str],
    *,
    name: str,
    model_type: str,
    tags: dict[str, str],
    metadata: dict[str, Any],
) -> str:
    import mlflow.pyfunc
    import pandas as pd
    from mlflow import MlflowClient
    from mlflow.entities import LoggedModelOutput, LoggedModelStatus
    from mlflow.models import Model

    # dtype=False: each column keeps the JSON's own number types (pandas would make a float column
    # whose examples are whole numbers an integer one, and the signature would then refuse floats)
    example_in = pd.read_json(model_dir / INPUT_EXAMPLE_FILE, orient="split", dtype=False)
    example_out = pd.read_json(model_dir / OUTPUT_EXAMPLE_FILE, orient="split", dtype=False)
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # a task log is not a terminal
    client = MlflowClient()
    run = client.get_run(run_id)
    logged = client.create_logged_model(
        run.info.experiment_id, name=name, source_run_id=run_id, model_type=model_type, tags=tags
    )
    big = files[0]  # the weights (or the graph): MLflow's save copies its artifacts, so this one is added after
    try:
        with tempfile.TemporaryDirectory(prefix=".trainpipe-pyfunc-", dir=_beside(model_dir)) as tmp:
            weights = Path(tmp) / "stage" / WEIGHTS_DIR  # pyfunc keeps an artifact folder under its own name
            weights.mkdir(parents=True)
            for file in files[1:]:
                shutil.copyfile(model_dir / file, weights / file)
            code = stage_code(meta, Path(tmp) / "code")
            with warnings.catch_warnings(), _pins_are_this_environments():
                warnings.filterwarnings(
                    "ignore", message=".*Inferred schema contains integer column"
                )  # class labels are integers
                mlflow.pyfunc.save_model(
                    Path(tmp) / "model",
                    python_model=str(python_model),
                    artifacts={"model": str(weights)},
                    code_paths=code,
                    signature=signature(example_in, example_out),
                    input_example=example_in,
                    pip_requirements=pip_requirements,
                    metadata=metadata,
                    mlflow_model=Model(artifact_path=logged.artifact_location, run_id=run_id, model_id=logged.model_id),
                )
            saved = Path(tmp) / "model" / "artifacts" / WEIGHTS_DIR
            if not (saved / files[1]).is_file():  # not where this MLflow keeps artifacts: say so, never guess
                raise RuntimeError(f"MLflow saved the model's artifacts elsewhere than {saved}")
            _link_or_copy(model_dir / big, saved / big)
            if not _link_tree(Path(tmp) / "model", logged.artifact_location):
                client.log_model_artifacts(logged.model_id, str(Path(tmp) / "model"))
    except BaseException:
        client.finalize_logged_model(logged.model_id, LoggedModelStatus.FAILED)
        raise
    client.finalize_logged_model(logged.model_id, LoggedModelStatus.READY)
    client.log_outputs(run_id, [LoggedModelOutput(logged.model_id, step=0)])
    return f"models:/{logged.model_id}"


def _beside(model_dir: Path) -> str | None:
    """The temporary folder's parent: beside the model where it is writable, so the weights are linked into
    the staged MLflow model (one file system), not copied; else the system's temporary folder."""
    return str(model_dir) if os.access(model_dir, os.W_OK) else None


def _link_or_copy(src: Path, dest: Path) -> None:
    """``dest`` as another name of ``src`` (a hard link), or a copy where they lie on different file systems.
    The files never change in place (each is written under a temporary name and renamed), so names stay equal."""
    try:
        os.link(src, dest)
    except OSError:
        shutil.copyfile(src, dest)


def _link_tree(src: Path, artifact_location: str) -> bool:
    """A model folder into a store on a local file system (``file:`` URIs, plain paths): every file linked
    there rather than copied (a 4 GB model is a name, not 4 GB more written). False where the store is
    another kind (S3, a tracking server's proxy): MLflow's client uploads it.

    Returns:
        Whether the store was local and the files are there.
    """
    from urllib.parse import unquote, urlparse

    parsed = urlparse(artifact_location)
    if parsed.scheme not in ("", "file") or (parsed.scheme == "file" and parsed.netloc not in ("", "localhost")):
        return False
    dest = Path(unquote(parsed.path))
    for path in sorted(src.rglob("*")):
        target = dest / path.relative_to(src)
        if path.is_dir():
            target.mkdir(parents=True, exist_ok=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.unlink(missing_ok=True)
            _link_or_copy(path, target)
    return True


@contextlib.contextmanager
def _pins_are_this_environments() -> Iterator[None]:
    """Skip MLflow's check that the model's requirements match this environment: they are this
    environment's own versions (:func:`requirements` reads them), so it can only agree, and it maps
    every installed distribution's files to its modules to find out, a scan that grows with the image."""
    from mlflow.utils import environment

    saved = environment.warn_dependency_requirement_mismatches
    environment.warn_dependency_requirement_mismatches = lambda requirements: None
    try:
        yield
    finally:
        environment.warn_dependency_requirement_mismatches = saved


def signature(example_in: Any, example_out: Any) -> Any:
    """Every raw feature column named, required and typed as the training frame had it (integer
    columns ``long``, real ones ``double``...): MLflow's schema check then refuses text in a numeric
    column, and a client sends what the model was trained on."""
    from mlflow.models import infer_signature

    return infer_signature(example_in, example_out)


def write_examples(model_dir: str | Path, example_in: Any, example_out: Any) -> None:
    """The input and output examples :func:`log_model` puts on the MLflow model (pandas ``split`` JSON)."""
    from trainpipe.contract.io import atomic_write_text

    model_dir = Path(model_dir)
    atomic_write_text(model_dir / INPUT_EXAMPLE_FILE, example_in.to_json(orient="split", index=False))
    atomic_write_text(model_dir / OUTPUT_EXAMPLE_FILE, example_out.to_json(orient="split", index=False))
