"""The one workaround kfp.local.DockerRunner needs on podman's Docker-compatible API (podman 4.3 here).

kfp 2.17's runner starts each task with ``auto_remove=True`` and reads the exit code afterwards:
:func:`kfp.local.docker_task_handler.run_docker_container`,
https://github.com/kubeflow/pipelines/blob/2.17.0/sdk/python/kfp/local/docker_task_handler.py
(``run_docker_container``). On podman the container is often removed before ``wait`` can read its status: the
runner catches ``docker.errors.NotFound`` and returns 0, so a task that exited 3 (bad data) is reported
SUCCESS and the run goes on; sometimes ``wait`` fails with "no such container" instead. Docker's engine keeps
the status for ``wait`` and does not show it.

:func:`exit_codes_kept` replaces that one function for the duration of a ``with`` block with
:func:`run_keeping_exit_code`, which is the same steps without ``auto_remove``: run detached, stream the logs,
wait for the exit code, then remove the container. Everything else of the runner (the image check, the
volumes, the run arguments, the task's status) is kfp's own. Drop this module once the runner reads the exit
code before removal (or takes ``auto_remove`` from ``container_run_args``).

The other podman 4.3 caveat, an image ENTRYPOINT that the runner's ``command`` does not replace, does not
arise: trainpipe's images have no ENTRYPOINT (their CMD is replaced).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


def run_keeping_exit_code(
    client: Any, image: str, command: list[str], volumes: dict[str, Any], **container_run_args: Any
) -> int:
    """kfp's ``run_docker_container`` without ``auto_remove``: the container's real exit code."""
    from kfp.local.docker_task_handler import add_latest_tag_if_not_present

    image = add_latest_tag_if_not_present(image=image)
    if not any(image in (i.tags + i.attrs.get("RepoDigests", [])) for i in client.images.list()):
        client.images.pull(image)
    container = client.containers.run(
        image=image, command=command, detach=True, stdout=True, stderr=True, volumes=volumes, **container_run_args
    )
    try:
        for line in container.logs(stream=True, follow=True):
            print(line.decode(), end="")
        return int(container.wait()["StatusCode"])
    finally:
        container.remove(force=True)


@contextlib.contextmanager
def exit_codes_kept() -> Iterator[None]:
    """Within the block, DockerRunner's tasks report the exit code their container really had."""
    from kfp.local import docker_task_handler

    original = docker_task_handler.run_docker_container
    docker_task_handler.run_docker_container = run_keeping_exit_code
    try:
        yield
    finally:
        docker_task_handler.run_docker_container = original
