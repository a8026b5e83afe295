"""The KubernetesPodOperator trainpipe's Kubernetes mode uses: the provider's operator with its
XCom sidecar made to pass Pod Security "restricted" too.

The provider adds a sidecar (``alpine``, a floating tag, run as root, no security context) to read
the result file. Here the sidecar runs the task's own trainpipe image (already pulled, pinned,
non-root; it has ``sh`` and ``cat``) with the same restricted security context as the main container.
Imported only when a DAG is built in Kubernetes mode.
"""

from __future__ import annotations

from typing import Any

from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator
from airflow.providers.cncf.kubernetes.utils.xcom_sidecar import PodDefaults
from kubernetes.client import models as k8s

from trainpipe.images import RUN_AS


def pod_security_context() -> k8s.V1PodSecurityContext:
    return k8s.V1PodSecurityContext(run_as_non_root=True, run_as_user=RUN_AS, run_as_group=RUN_AS, fs_group=RUN_AS,
                                    seccomp_profile=k8s.V1SeccompProfile(type="RuntimeDefault"))


def container_security_context() -> k8s.V1SecurityContext:
    return k8s.V1SecurityContext(allow_privilege_escalation=False, run_as_non_root=True, capabilities=k8s.V1Capabilities(drop=["ALL"]),
                                 seccomp_profile=k8s.V1SeccompProfile(type="RuntimeDefault"))


class TrainpipePodOperator(KubernetesPodOperator):
    """``KubernetesPodOperator`` with Pod Security "restricted" contexts by default (pod and main
    container), and an XCom sidecar in the task's image with the same container context."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("security_context", pod_security_context())
        kwargs.setdefault("container_security_context", container_security_context())
        super().__init__(**kwargs)

    def build_pod_request_obj(self, context: Any = None) -> k8s.V1Pod:
        pod = super().build_pod_request_obj(context)
        for container in pod.spec.containers:
            if container.name == PodDefaults.SIDECAR_CONTAINER_NAME:
                container.image = self.image
                container.security_context = container_security_context()
        return pod
