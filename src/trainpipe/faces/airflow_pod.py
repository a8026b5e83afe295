"""Kubernetes mode of the Airflow faces: the same command in a ``KubernetesPodOperator``.

The pod gets the hardware profile's translation (:mod:`trainpipe.services.pods`, the one every pod
trainpipe creates gets) as its template, the component's image, and the result JSON back through
XCom. The provider's XCom sidecar (``alpine``, floating tag, root, no security context) runs the
task's own image with the restricted container context instead. A component whose local operator
emits asset events (snapshot_dataset's DVC hash) emits the same extra here.
Imported only when a DAG is built in Kubernetes mode.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator
from airflow.providers.cncf.kubernetes.utils.xcom_sidecar import PodDefaults
from kubernetes.client import models as k8s

from trainpipe.faces.airflow_steps import as_written, check_neighbours
from trainpipe.faces.assets import emit_assets
from trainpipe.faces.command import component_command
from trainpipe.services import pods


def _context(kind: type, fields: dict[str, Any]) -> Any:
    from kubernetes.client import ApiClient

    return ApiClient()._ApiClient__deserialize(fields, kind.__name__)  # the client's own JSON -> model mapping


class TrainpipePodOperator(KubernetesPodOperator):
    """``KubernetesPodOperator`` running one trainpipe component: restricted contexts, the XCom
    sidecar in the task's image, and the component's asset events."""

    template_fields: Sequence[str] = (*KubernetesPodOperator.template_fields, "settings")

    def __init__(self, *, operator_cls: Any = None, settings: dict[str, Any] | None = None, **kwargs: Any) -> None:
        kwargs.setdefault("security_context", _context(k8s.V1PodSecurityContext, pods.pod_security()))
        kwargs.setdefault("container_security_context", _context(k8s.V1SecurityContext, pods.container_security()))
        super().__init__(**kwargs)
        self.operator_cls = operator_cls
        self.settings = dict(settings or {})
        if operator_cls is not None:
            check_neighbours(self, operator_cls, self.settings)

    def render_template(
        self, content: Any, context: Any, jinja_env: Any = None, seen_oids: set[int] | None = None
    ) -> Any:
        """As the local operator renders: a mapping from the params keeps its keys' order (:func:`as_written`)."""
        return super().render_template(content, context, as_written(jinja_env or self.get_template_env()), seen_oids)

    def build_pod_request_obj(self, context: Any = None) -> k8s.V1Pod:
        pod = super().build_pod_request_obj(context)
        for container in pod.spec.containers:
            if container.name == PodDefaults.SIDECAR_CONTAINER_NAME:
                container.image = self.image
                container.security_context = _context(k8s.V1SecurityContext, pods.container_security())
        return pod

    def execute(self, context: Any) -> Any:
        result = super().execute(context)
        if self.operator_cls is not None and isinstance(result, dict):
            emit_assets(self.operator_cls, self.settings, self.outlets, context, result)
        return result


def kubernetes_task(
    component: str,
    *,
    task_id: str,
    settings: dict[str, Any],
    image: str,
    namespace: str = "default",
    profile: Any = None,
    resources: Any = None,
    operator_cls: Any = None,
    **kwargs: Any,
) -> Any:
    """The same command in a pod, with the component image and the hardware profile's translation.

    The result JSON goes to ``/airflow/xcom/return.json`` so it becomes the XCom value.
    """
    command = component_command(
        component,
        settings,
        orchestrator="airflow",
        run_id="{{ run_id }}",
        result_path="/airflow/xcom/return.json",
        python="python",
    )
    kwargs["env_vars"] = {"TRAINPIPE_TRY_NUMBER": "{{ ti.try_number }}", **(kwargs.get("env_vars") or {})}
    if profile is not None:
        metadata: dict[str, Any] = {}
        if component == "train_model" and profile.metrics_port:  # its ranks serve metrics: the PodMonitor finds the pod
            settings = {"metrics_port": profile.metrics_port, **settings}
            base = int(settings["metrics_port"]) if str(settings["metrics_port"]).isdigit() else profile.metrics_port
            labels, annotations = pods.metrics_metadata(base)
            metadata = {"labels": labels, "annotations": annotations}
            command = component_command(
                component,
                settings,
                orchestrator="airflow",
                run_id="{{ run_id }}",
                result_path="/airflow/xcom/return.json",
                python="python",
            )
        training = component == "train_model"
        spec = pods.pod_spec(profile, resources or profile.default, container_name="base", training=training)
        if training:  # killed from the UI (on_kill deletes the pod): the same grace to checkpoint
            kwargs.setdefault("termination_grace_period", profile.termination_grace_s)
        queue = pods.queue_labels(profile)  # Kueue admits the pod from the team's LocalQueue
        if queue:
            metadata["labels"] = {**metadata.get("labels", {}), **queue}
        namespace = profile.namespace or namespace
        kwargs.setdefault("pod_template_dict", {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec})
        kwargs.setdefault("image_pull_policy", profile.image_pull_policy)
    return TrainpipePodOperator(
        task_id=task_id,
        name=task_id.replace("_", "-"),
        namespace=namespace,
        image=image,
        cmds=command[:3],
        arguments=command[3:],
        do_xcom_push=True,
        get_logs=True,
        operator_cls=operator_cls,
        settings=settings,
        **kwargs,
    )
