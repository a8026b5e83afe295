"""The Airflow 3 operator every component's Airflow face is: it runs the entrypoint on the worker.

The step's log reaches the task log line by line as it is written; a task that is killed (a
timeout, "mark failed", ``airflow tasks clear``) ends the step's whole process group, torchrun and
its ranks included. Only transient exit codes are retried: a failed suite, bad input or a failed
gate fails the task for good. A preemption (exit 75 after a checkpoint: "preempted by SIGTERM …") spends
no retry: the operator runs the entrypoint again in the same try, which resumes from the checkpoint, up to
``max_preemptions`` times (the hardware profile's); one more is an ordinary transient failure. Kubernetes
mode runs the same command in a pod (:mod:`trainpipe.faces.airflow_pod`); the DAG topology is in
:mod:`trainpipe.pipelines.dag_topology`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, cast

from airflow.providers.standard.utils.skipmixin import SkipMixin
from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException
from pydantic import BaseModel, TypeAdapter, ValidationError

from trainpipe.contract.errors import InputError, is_retryable_exit
from trainpipe.contract.result import ErrorRecord
from trainpipe.faces.airflow_steps import as_written, check_neighbours, templated
from trainpipe.faces.assets import emit_assets
from trainpipe.faces.command import component_command, error_record, note_failure, stream

#: Seconds a killed step gets to stop its ranks after SIGTERM, before SIGKILL.
KILL_GRACE_S = 10.0
#: How many preemptions the step has taken in this try (0 on its first run): the fault hooks read it.
PREEMPTION_ENV = "TRAINPIPE_PREEMPTION"


def outcome(component: str, code: int, last: str, *, retries_left: bool = True) -> Exception:
    """The Airflow exception for a failed step: retried only when the exit code is transient and the task has
    a retry left (a final failure never says it will retry)."""
    last = last or f"exit {code}"
    if is_retryable_exit(code):
        then = "will retry" if retries_left else "no retry left"
        return AirflowException(f"{component} exited {code} (transient, {then}): {last}")
    return AirflowFailException(f"{component} exited {code} (permanent, not retried): {last}")


def is_preemption(code: int, message: str) -> bool:
    """Whether a step's exit is a preemption after a checkpoint (exit 75, its record says "preempted by ...")
    rather than an unreachable service (also 75)."""
    return code == 75 and message.startswith("preempted")


def rerun_after(component: str, code: int, message: str, taken: int, bound: int) -> str | None:
    """The one line to log when a preempted step is run again in the same try (no retry spent), or None: not a
    preemption, or the ``bound`` (``max_preemptions``) is reached and it fails as any transient exit does."""
    if not is_preemption(code, message) or taken >= bound:
        return None
    return f"{component}: {message} (preemption {taken + 1} of at most {bound}: running it again, no retry spent)"


def retries_left(ti: Any) -> bool:
    """Whether Airflow retries the task after this try (its try number is within its retries)."""
    try:
        return int(ti.try_number) <= int(ti.task.retries)
    except (AttributeError, TypeError, ValueError):
        return True


class TrainpipeOperator(BaseOperator):
    """Run one trainpipe component on the worker; its result JSON is the XCom value.

    Args:
        settings: The component's settings (templated), as its CLI flags take them.
        env: Extra environment of the step (the platform policy; never a secret: those come
            from the worker's own environment or Airflow connections, not from the DAG).
        max_preemptions: Preemptions (exit 75 after a checkpoint) run again in the same try without spending
            a retry (the hardware profile's ``max_preemptions``); one more fails as any transient exit does.
    """

    component: ClassVar[str] = ""
    #: The component's settings model (its spec's ``<Name>Config``): the settings are checked against it.
    config: ClassVar[type[BaseModel] | None] = None
    template_fields: Sequence[str] = ("settings",)
    ui_color = "#e8f4ea"

    def __init__(
        self, *, settings: dict[str, Any], env: dict[str, str] | None = None, max_preemptions: int = 3, **kwargs: Any
    ) -> None:
        self.check_settings(settings)
        super().__init__(**kwargs)
        self.settings = settings
        self.env = dict(env or {})
        self.max_preemptions = max_preemptions
        self._proc: subprocess.Popen[str] | None = None
        self._killed = False
        self._held: list[str] = []
        check_neighbours(self, type(self), settings)

    def render_template(
        self, content: Any, context: Any, jinja_env: Any = None, seen_oids: set[int] | None = None
    ) -> Any:
        """Render only what is a template: a DAG that renders native objects would otherwise read every
        plain string of the settings as a Python literal (a team's ``"1e5"`` or ``"0.10"`` in its
        ``train_config`` arrived as a float), and a setting is never coerced on the way; what is a template
        renders a mapping's keys in their order (:func:`as_written`)."""
        if isinstance(content, str) and not any(mark in content for mark in ("{{", "{%", "{#")):
            return content
        return super().render_template(content, context, as_written(jinja_env or self.get_template_env()), seen_oids)

    @classmethod
    def check_settings(cls, settings: dict[str, Any]) -> None:
        """The settings are the component's, so a DAG that passes one its spec lacks, a value its type
        refuses, settings that do not fit together, or a ``train_config`` its training function's typed
        config refuses, fails to import, naming it, instead of failing when the task runs. A templated
        value is checked when it is rendered, by the step itself.

        Raises:
            TypeError: one line naming the setting and what was wrong.
        """
        if cls.config is None:
            return
        fields = cls.config.model_fields
        unknown = sorted(set(settings) - set(fields))
        if unknown:
            raise TypeError(
                f"{cls.__name__}: {', '.join(map(repr, unknown))} is not a setting of {cls.component} "
                f"(its settings: {', '.join(fields)})"
            )
        hidden = {name for name, value in settings.items() if templated(value)}
        for name, value in settings.items():
            if name in hidden:
                continue
            try:
                TypeAdapter(cast(Any, fields[name].annotation)).validate_python(value)
            except ValidationError as exc:
                raise TypeError(f"{cls.__name__}: setting {name!r}: {exc.errors()[0]['msg']}") from None
        try:
            cls._check_together(settings, hidden)
        except InputError as exc:
            raise TypeError(f"{cls.__name__}: {exc}") from None

    @classmethod
    def _check_together(cls, settings: dict[str, Any], hidden: set[str]) -> None:
        """The rules across settings and a typed ``train_config``, as far as no template hides a value."""
        from trainpipe.contract.entrypoint import is_plain_string

        assert cls.config is not None
        fields = cls.config.model_fields
        config = settings.get("train_config")
        default_function = fields["train_function"].default if "train_function" in fields else ""
        function = settings.get("train_function", default_function)
        if isinstance(config, dict) and isinstance(function, str) and not templated(function):
            from trainpipe.training import config_types

            if not config_types.importable(function):  # the DAG processor's sys.path lacks the team's package
                import warnings

                warnings.warn(
                    f"{cls.__name__}: {config_types.unchecked(function, 'where this DAG is parsed')}",
                    config_types.UncheckedConfigWarning,
                    stacklevel=2,
                )
        if "train_config" in hidden and isinstance(config, dict) and not templated(function):
            from trainpipe.training import config_types

            rendered_later = frozenset(k for k, v in config.items() if templated(v))
            config_types.check(str(function), config, ignore=rendered_later)
        if any(not is_plain_string(fields[n].annotation) for n in hidden):
            return  # a number or a mapping known only when rendered: the step checks them together
        # text known only when rendered (a path, a name from params) stands in as its template, so the rules
        # across settings still run where it fits its field; what the template renders is checked by the step
        unset = [n for n, f in fields.items() if f.is_required() and n not in settings]
        try:
            cls.config.model_validate({**settings, **dict.fromkeys(unset, "{{ set when the task runs }}")})
        except ValidationError as exc:
            from trainpipe.contract.config import describe_errors

            errors = [e for e in exc.errors() if not (e.get("loc") and e["loc"][0] in (*hidden, *unset))]
            if errors:
                raise InputError(describe_errors(errors, cls.component)) from None

    @classmethod
    def asset_extra(cls, result: dict[str, Any], settings: dict[str, Any]) -> dict[str, Any] | None:
        """The extra of the asset events this task emits for its ``outlets`` (none by default)."""
        return None

    def emit_assets(self, context: Any, result: dict[str, Any]) -> None:
        emit_assets(type(self), self.settings, self.outlets, context, result)

    def command(self, context: Any, error_record: str | None = None) -> list[str]:
        """The command this task runs: the component's entrypoint with the task's settings (and where it describes
        a failure)."""
        run_id = str(context["run_id"])
        return component_command(
            self.component, self.settings, orchestrator="airflow", run_id=run_id, error_record=error_record
        )

    def execute(self, context: Any) -> Any:
        ti = context.get("ti")
        env = dict(
            os.environ,
            **self.env,
            TRAINPIPE_ORCHESTRATOR="airflow",
            TRAINPIPE_RUN_ID=str(context["run_id"]),
            TRAINPIPE_TRY_NUMBER=str(getattr(ti, "try_number", None) or 1),
        )  # the Pushgateway's retries figure
        taken, self._killed = 0, False
        while True:
            code, out, message = self._run_once(context, {**env, PREEMPTION_ENV: str(taken)})
            line = rerun_after(self.component, code, message, taken, self.max_preemptions) if code else None
            if line is None or self._killed:  # a task being stopped stops: its step's checkpoint waits for a retry
                for said in self._held:
                    self.log.info("%s", said)
                break
            self.log.warning("%s", line)  # the preemption's one line, no traceback: it resumes from its checkpoint
            taken += 1
        if code == 0:
            result = json.loads(out.strip().splitlines()[-1])
            self.emit_assets(context, result)
            return result
        note_failure(self.component, code, message)
        raise outcome(self.component, code, message, retries_left=retries_left(ti))

    def _run_once(self, context: Any, env: dict[str, str]) -> tuple[int, str, str]:
        """Run the entrypoint once: its exit code, its output and (when it failed) its one line."""
        self._held = []
        preempted = f"trainpipe {self.component}: preempted"

        def emit(line: str) -> None:
            text = line.rstrip("\n")
            if text.startswith(preempted):  # said once: by the rerun's line, or after the run when none follows
                self._held.append(text)
            else:
                self.log.info("%s", text)

        with error_record() as (record, fds):  # a file with no name: a task killed outright leaves none behind
            try:
                code, out = stream(
                    self.command(context, record),
                    env,
                    emit,
                    on_start=self._started,
                    start_new_session=True,
                    pass_fds=fds,
                )  # its own process group: on_kill ends all of it
            finally:
                self.on_kill()  # a timeout raised inside the read loop: nothing of the step survives the task
            message = ErrorRecord.explain(self.component, code, record) if code != 0 else ""
        return code, out, message

    def _started(self, proc: subprocess.Popen[str]) -> None:
        self._proc = proc

    def on_kill(self) -> None:
        """End the step's process group (the entrypoint, torchrun and every rank): SIGTERM, then SIGKILL. A step
        preempted by it is not run again in this try (Airflow asked the task to stop)."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        self._killed = True
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=KILL_GRACE_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        except ProcessLookupError:
            pass


def component_task(
    operator_cls: type[TrainpipeOperator],
    task_id: str,
    settings: dict[str, Any],
    *,
    mode: str,
    image: str | None,
    profile: Any = None,
    resources: Any = None,
    **kwargs: Any,
) -> Any:
    """One step in either mode: the operator on the worker (``local``) or the same command in a pod (``kubernetes``)."""
    name = operator_cls.component
    kwargs.setdefault(
        "doc_md",
        f"trainpipe `{name}`: runs `python -m trainpipe.components.{name}` "
        f"({'in a pod with the component image' if mode == 'kubernetes' else 'on the worker'}); its result JSON is the "
        "XCom value. "
        "Only transient exits (75, signals) are retried; a preemption is run again without spending a retry.",
    )
    operator_cls.check_settings(settings)  # a setting the spec lacks fails here, when the DAG file is parsed
    if mode == "kubernetes":
        from trainpipe.faces.airflow_pod import kubernetes_task  # the provider's import cost only where pods run

        return kubernetes_task(
            operator_cls.component,
            task_id=task_id,
            settings=settings,
            image=cast(str, image),  # kubernetes mode: the DAG's settings give every step its image
            profile=profile,
            resources=resources,
            operator_cls=operator_cls,
            **kwargs,
        )
    if mode != "local":
        raise ValueError(f"mode: {mode!r} is not local or kubernetes")
    return operator_cls(task_id=task_id, settings=settings, **kwargs)


#: The XCom key the approval task keeps its answer under (see trainpipe.faces.airflow_approval).
ANSWER_KEY = "answer"


class PromoteOperator(TrainpipeOperator):
    """``trainpipe promote`` on the worker, with the answer Airflow's approval task collected: moves
    the serving alias when a person approved; with ``reject``, records the rejection (or the
    timeout's default) on the version and in the audit log, and moves nothing.

    Args:
        settings: ``model_uri`` (``models:/<name>/<version>``), ``alias``, ``tracking_uri`` (templated).
        approval_task_id: The ApprovalOperator whose answer (its XCom) this acts on.
        reject: Record a rejection instead (the task that runs when the approval skipped promotion).
    """

    component = "promote"
    ui_color = "#fdf3d8"

    def __init__(self, *, approval_task_id: str = "approve", reject: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.approval_task_id = approval_task_id
        self.reject = reject

    def command(self, context: Any, error_record: str | None = None) -> list[str]:
        answer = context["ti"].xcom_pull(task_ids=self.approval_task_id, key=ANSWER_KEY) or {}
        user = answer.get("responded_by_user") or {}
        approver = str(user.get("name") or user.get("id") or "") or "airflow: no answer before the approval timed out"
        reason = str((answer.get("params_input") or {}).get("reason") or "").strip()
        if not reason:
            reason = (
                ("approved" if not self.reject else "rejected") + " in Airflow"
                if user
                else "no answer before the timeout: rejected by default"
            )
        s = self.settings
        cmd = [
            sys.executable,
            "-m",
            "trainpipe.app.cli",
            "promote",
            str(s["model_uri"]),
            "--reason",
            reason,
            "--approver",
            approver,
            "--json",
        ]
        cmd += ["--alias", str(s["alias"])] if s.get("alias") else []
        cmd += ["--tracking-uri", str(s["tracking_uri"])] if s.get("tracking_uri") else []
        cmd += ["--error-record", error_record] if error_record else []
        return cmd + (["--reject"] if self.reject else [])


class GateOperator(BaseOperator, SkipMixin):
    """Continue only when ``condition(**context)`` is truthy (its value is the XCom); otherwise skip
    every task downstream, as ``ShortCircuitOperator`` does.

    Written here, not taken from ``ShortCircuitOperator``: importing that module (the PythonOperator
    family) costs every DAG file a noticeable share of its parse time; SkipMixin alone does not.
    """

    inherits_from_skipmixin = True
    ui_color = "#f0ede4"

    def __init__(self, *, condition: Callable[..., Any], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.condition = condition

    def execute(self, context: Any) -> Any:
        result = self.condition(**context)
        self.log.info("Condition result is %s", bool(result))
        if not result:
            to_skip = [t for t in context["task"].get_flat_relatives(upstream=False) if not t.is_teardown]
            if to_skip:
                self.log.info("Skipping downstream tasks: %s", ", ".join(sorted(t.task_id for t in to_skip)))
                self.skip(ti=context["ti"], tasks=to_skip)
        return result
