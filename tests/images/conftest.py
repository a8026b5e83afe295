"""The images tier's machinery: podman with the project's settings (images/containers.conf), the images
``make images`` built, a container run as a pod would run it, and podman's Docker-compatible socket for
kfp.local.DockerRunner.

Where this machine cannot run containers at all (no podman, no user namespaces, podman refusing to start one),
every test here is skipped with that reason; under CI (``CI=true``) the same finding fails instead, so a CI
machine that lost podman says so. A machine that runs containers but has not built the images fails: ``make
test-images`` builds them first.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO

CONF = REPO / "images" / "containers.conf"
#: Seconds a component gets in its container: an import of torch and TensorFlow in a fresh container on two
#: loaded cores takes most of a minute.
TIMEOUT_S = 600


def podman_env() -> dict[str, str]:
    """The environment every podman call here runs in: the project's settings file, no other."""
    return {**os.environ, "CONTAINERS_CONF": str(CONF)}


def podman(*args: str, timeout: float = TIMEOUT_S, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        ["podman", *args], capture_output=True, text=True, env=podman_env(), timeout=timeout, check=False
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)} exited {proc.returncode}: {proc.stderr[-3000:]}")
    return proc


def _cannot_run_containers() -> str | None:
    """Why this machine cannot run a container, or None when it can."""
    if shutil.which("podman") is None:
        return "podman is not installed (make podman installs it)"
    if not Path("/proc/self/uid_map").exists():
        return "this kernel has no user namespaces"
    info = podman("info", "--format", "{{.Host.OCIRuntime.Name}}", timeout=120, check=False)
    if info.returncode != 0:
        return f"podman cannot start here: {info.stderr.strip().splitlines()[-1:]}"
    return None


@pytest.fixture(scope="session")
def can_run_containers() -> None:
    reason = _cannot_run_containers()
    if reason is None:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"the images tier cannot run under CI: {reason}", pytrace=False)
    pytest.skip(f"the images tier needs containers: {reason}")


def _built(kind: str) -> str:
    from trainpipe.services.images import reference

    ref = reference(kind)
    if podman("image", "exists", ref, check=False).returncode != 0:
        pytest.fail(f"{ref} is not built: run `make images` (make test-images does)", pytrace=False)
    return ref


@pytest.fixture(scope="session")
def cpu_image(can_run_containers) -> str:
    return _built("cpu")


@pytest.fixture(scope="session")
def data_image(can_run_containers) -> str:
    return _built("data")


def writable(path: Path) -> Path:
    """A folder the image's non-root user (10001) may write in, whoever runs the tests."""
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o777)
    return path


def run_in(
    image: str,
    *command: str,
    mounts: dict[Path, str] | None = None,
    env: dict[str, str] | None = None,
    name: str | None = None,
    rm: bool = True,
    read_only: bool = True,
) -> subprocess.CompletedProcess:
    """The command in ``image`` as a pod runs it: the image's user (non-root), a read-only root filesystem (podman
    puts a tmpfs on /tmp, the images' HOME), no network; ``mounts`` maps host paths to container paths (a path
    ending in ``:ro`` read-only)."""
    args = ["run", "--network", "none", f"--read-only={str(read_only).lower()}"]
    args += ["--rm"] if rm else []
    args += ["--name", name] if name else []
    for host, inside in (mounts or {}).items():
        args += ["--volume", f"{host}:{inside}"]
    for key, value in (env or {}).items():
        args += ["--env", f"{key}={value}"]
    return podman(*args, image, *command, check=False)


@pytest.fixture(scope="session")
def podman_socket(can_run_containers, tmp_path_factory) -> Iterator[str]:
    """``podman system service`` on a socket of its own (Docker's API, which the ``docker`` SDK and
    kfp.local.DockerRunner speak); its URL, for DOCKER_HOST. Stopped at the session's end."""
    sock = tmp_path_factory.mktemp("podman") / "podman.sock"
    proc = subprocess.Popen(
        ["podman", "system", "service", "--time=0", f"unix://{sock}"],
        env=podman_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not sock.exists():  # the service creates its socket once it listens
        if proc.poll() is not None:
            raise RuntimeError(f"podman system service exited {proc.returncode}: {proc.stderr.read()[-2000:]}")
        assert time.monotonic() < deadline, "podman system service made no socket in 60 s"
        time.sleep(0.1)
    try:
        yield f"unix://{sock}"
    finally:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=20)
        if proc.poll() is None:
            proc.kill()
