"""The container entrypoint shared by every component.

``python -m trainpipe.components.<name> [--config FILE] [--<field> VALUE ...]``

Flags are generated from the component's config model, so the CLI, the KFP face
and the Airflow face can never drift from the spec. The entrypoint reads the
lineage of its input artifacts, runs the core, marks each output directory
complete, writes the result JSON, and maps errors to documented exit codes
(see :mod:`trainpipe.contract.errors`). User mistakes print one line, no traceback; a
preemption prints one line too, not an error. What the step writes takes the policy's
``output_umask`` (files 0640, folders 0750 by default), set before anything is written.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
import types
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import JsonDict

from trainpipe.contract import artifacts, push
from trainpipe.contract import dry as dry_run
from trainpipe.contract import lineage as lineage_mod
from trainpipe.contract.config import M, build, load_file
from trainpipe.contract.errors import EXIT_INTERNAL, EXIT_OK, InputError, Preempted, TrainpipeError
from trainpipe.contract.io import atomic_write_json, current_umask, restrict_umask
from trainpipe.contract.lineage import Lineage
from trainpipe.contract.result import ComponentResult, ErrorRecord
from trainpipe.contract.runtime import PROFILE_ENV, Runtime, profile_label

#: A field's ``json_schema_extra``: an input artifact.
INPUT: JsonDict = {"role": "input"}
#: An input that may also be raw data the user names (a file, or a folder of Parquet files) rather than an artifact.
SOURCE: JsonDict = {"role": "input", "source": True}
#: A field's ``json_schema_extra``: the output folder.
OUTPUT: JsonDict = {"role": "output"}


def settings_input(file: str, made_by: str) -> JsonDict:
    """An input artifact that holds settings of this step (``file`` in it, written by the step ``made_by``):
    laid over the step's own before they are checked (:func:`lay_settings`; train_model's ``tuned``)."""
    return {**INPUT, "settings": file, "made_by": made_by}


def _role_fields(model: type[BaseModel], role: str) -> list[str]:
    out = []
    for name, f in model.model_fields.items():
        extra = f.json_schema_extra if isinstance(f.json_schema_extra, dict) else {}
        if extra.get("role") == role:
            out.append(name)
    return out


def source_fields(model: type[BaseModel]) -> list[str]:
    """Input fields that may name raw data instead of an artifact."""
    return [
        n
        for n, f in model.model_fields.items()
        if isinstance(f.json_schema_extra, dict) and f.json_schema_extra.get("source")
    ]


def input_fields(model: type[BaseModel]) -> list[str]:
    """Config fields that name input artifact directories."""
    return _role_fields(model, "input")


def output_fields(model: type[BaseModel]) -> list[str]:
    """Config fields that name output artifact directories."""
    return _role_fields(model, "output")


#: A setting that must hold what the same setting holds on the step that made one of this step's inputs (its
#: value names that input): register_model moves the alias of the model evaluate_model compared with.
SAME_AS_PRODUCER = "same_as_producer_of"


def producer_settings(model: type[BaseModel]) -> dict[str, list[str]]:
    """Input field -> the settings this step must share with the step that made it (:data:`SAME_AS_PRODUCER`)."""
    out: dict[str, list[str]] = {}
    for name, f in model.model_fields.items():
        extra = f.json_schema_extra if isinstance(f.json_schema_extra, dict) else {}
        if extra.get(SAME_AS_PRODUCER):
            out.setdefault(str(extra[SAME_AS_PRODUCER]), []).append(name)
    return out


def check_same_as_producer(
    step: str,
    model: type[BaseModel],
    given: Mapping[str, Any],
    field: str,
    producer: str,
    producer_model: type[BaseModel],
    producer_given: Mapping[str, Any],
    known: Callable[[Any], bool],
) -> None:
    """The settings ``step`` must share with ``producer``, whose output its input ``field`` is, as far as
    both are known before the run (``known``: a constant, not a template or a pipeline parameter): a
    setting not given is its spec's default; one the producer leaves unset binds nothing. What the step
    checks again when it runs (register_model against the decision), refused before anything runs.

    Raises:
        InputError: one line naming the setting and both values.
    """
    for name in producer_settings(model).get(field, []):
        if name not in producer_model.model_fields:
            continue
        mine = given.get(name, model.model_fields[name].get_default(call_default_factory=True))
        theirs = producer_given.get(name, producer_model.model_fields[name].get_default(call_default_factory=True))
        if theirs is None or not known(mine) or not known(theirs):
            continue
        if mine != theirs:
            raise InputError(
                f"{name}: {step} has {mine!r}, but {producer}, whose output its {field} is, has {theirs!r}; give "
                f"both steps the same {name}"
            )


def is_plain_string(annotation: Any) -> bool:
    args = typing.get_args(annotation)
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        non_none = [a for a in args if a is not type(None)]
        return len(non_none) == 1 and is_plain_string(non_none[0])
    return annotation in (str, Path) or origin is typing.Literal


def _optional(annotation: Any) -> bool:
    return typing.get_origin(annotation) in (typing.Union, types.UnionType) and type(None) in typing.get_args(
        annotation
    )


def _structured(annotation: Any) -> bool:
    """A setting whose value is a mapping, a list or a nested settings model (JSON text on a flag)."""
    options = [a for a in typing.get_args(annotation) if a is not type(None)] if _optional(annotation) else [annotation]
    for a in options:
        origin = typing.get_origin(a) or a
        if origin in (dict, list, tuple) or (isinstance(origin, type) and issubclass(origin, BaseModel)):
            return True
    return False


def _parse_value(raw: str, annotation: Any, name: str = "", where: str = "config") -> Any:
    """A flag's (or a rendered template's) text as the setting's value: JSON, as every face writes it.

    Text settings stay text (a JSON-quoted one is unquoted). Anything else is read by the JSON parser,
    so ``1e-05`` is a float and a mapping keeps its key order; a bare word that is not JSON (``bf16``,
    ``True``) goes on as text for the spec to accept or refuse. A mapping or list that is not JSON is
    refused here, in one line.

    Raises:
        InputError: a structured setting whose text is not JSON.
    """
    if raw == "null" and _optional(annotation):  # an unset setting, as templating engines emit None with tojson
        return None
    if is_plain_string(annotation):
        if len(raw) >= 2 and raw[0] == raw[-1] == '"':
            try:  # a JSON-quoted string, as templating engines emit with tojson
                return json.loads(raw)
            except ValueError:
                return raw
        return raw
    try:
        return json.loads(raw)
    except ValueError:
        if not _structured(annotation):
            return raw
    from trainpipe.contract.config import parse_json

    return parse_json(raw, f"{where} field {name!r}")


def parse_settings(model: type[M], settings: dict[str, Any], where: str) -> M:
    """A component's settings as a face holds them (rendered templates are strings, read as the flags
    are), validated into its config.

    Raises:
        InputError: one line naming every bad field.
    """
    data = {
        k: _parse_value(v, model.model_fields[k].annotation, k, where)
        if isinstance(v, str) and k in model.model_fields
        else v
        for k, v in settings.items()
        if v is not None and v != ""
    }
    return build(model, data, where=where)


def read_settings(model: type[BaseModel], args: dict[str, Any], where: str) -> dict[str, Any]:
    """The settings a command line gives (the parsed flags, ``config`` a file they override), each read as
    its setting's type from the text every face writes (:func:`_parse_value`): not yet validated.

    Raises:
        InputError: the file cannot be read, or a structured flag is not JSON.
    """
    data: dict[str, Any] = {}
    if args.get("config"):
        data.update(load_file(args["config"]))
    for fname, f in model.model_fields.items():
        if fname in args:
            data[fname] = _parse_value(args[fname], f.annotation, fname, where)
    return data


def lay_settings(model: type[BaseModel], settings: dict[str, Any]) -> dict[str, Any]:
    """``settings`` as read (not yet checked) with what each settings input they name holds laid over them
    (:func:`settings_input`: tune_model's best trial's over train_model's flags), in that file's own key order.
    They are then checked once, whole: a typed ``train_config`` the flags leave out is the artifact's.

    Raises:
        InputError: a settings input whose file is missing, not JSON or empty.
    """
    for name, f in model.model_fields.items():
        extra = f.json_schema_extra if isinstance(f.json_schema_extra, dict) else {}
        where = settings.get(name)
        if not extra.get("settings") or not where or not isinstance(where, str):
            continue
        path = Path(where) / str(extra["settings"])
        try:
            held = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            raise InputError(
                f"{name}: {str(path)!r} is missing or not JSON (is it {extra['made_by']}'s output?)"
            ) from None
        if not held or not isinstance(held, dict):
            raise InputError(f"{name}: {str(path)!r} holds no settings ({extra['made_by']} gave none)")
        settings = {**settings, **held}
    return settings


def metavar(annotation: Any) -> str:
    """What a flag takes, for ``--help``: a closed setting names every choice (``{fp32|bf16|fp16}``,
    a list of them, ``true|false``), an open one its kind (TEXT, INT, NUMBER, JSON)."""
    options = [a for a in typing.get_args(annotation) if a is not type(None)] if _optional(annotation) else [annotation]
    a = options[0] if len(options) == 1 else annotation
    origin = typing.get_origin(a)
    if origin is typing.Literal:
        return "{" + "|".join(str(v) for v in typing.get_args(a)) + "}"
    if origin is list:
        (item,) = typing.get_args(a) or (Any,)
        inner = metavar(item)
        return f"[{inner}, ...]" if inner.startswith("{") else "LIST"
    if a is bool:
        return "{true|false}"
    return {str: "TEXT", int: "INT", float: "NUMBER", Path: "PATH"}.get(a, "JSON")


class _OneLineParser(argparse.ArgumentParser):
    """argparse refuses an unknown or malformed flag with its whole usage (18 lines for validate_data); here that is
    a bad input like any other: one line, ``trainpipe <name>: error: ...``, exit 2."""

    def error(self, message: str) -> typing.NoReturn:
        name = self.prog.rsplit(".", 1)[-1]
        self.exit(2, f"trainpipe {name}: error: {message} (--help lists the settings)\n")


def make_parser(name: str, model: type[BaseModel], doc: str) -> argparse.ArgumentParser:
    """Build the argument parser for a component from its config model: a flag per setting, its help
    the spec's description, its choices (for a closed setting) and its default."""
    parser = _OneLineParser(
        prog=f"python -m trainpipe.components.{name}",
        description=doc,
        allow_abbrev=False,  # `--epoch 2` is a typo to refuse, not `--epochs 2`
        epilog="Exit codes: 0 ok, 1 internal error, 2 bad input, 3 data failed its suite, 4 gate not passed, "
        "6 the audit log failed verification, 7 a model failed signature verification, 8 its job was cancelled or "
        "deleted outside trainpipe, "
        "75 service unavailable or preempted after a checkpoint (retry), 77 not permitted.",
    )
    parser.add_argument("--config", help="YAML or JSON file of settings; flags override it")
    parser.add_argument("--result", help="where to write the result JSON (default: stdout only)")
    parser.add_argument(
        "--error-record",
        help="where to write the error record JSON (component, exit_code, message) when the step fails; a runner "
        "reads it instead of the log",
    )
    parser.add_argument("--run-id", help="orchestrator run id, recorded in the lineage")
    parser.add_argument("--orchestrator", help="orchestrator name (kfp, airflow, manual), recorded in the lineage")
    group = parser.add_argument_group("settings")
    for fname, f in model.model_fields.items():
        flag = "--" + fname.replace("_", "-")
        default = "" if f.is_required() else f" (default: {f.get_default(call_default_factory=True)!r})"
        group.add_argument(
            flag,
            dest=fname,
            default=argparse.SUPPRESS,
            metavar=metavar(f.annotation),
            help=(f.description or "") + default,
        )
    return parser


Core = Callable[[Any, Lineage, Runtime], ComponentResult]
#: A component's dry run (:mod:`trainpipe.contract.dry`): ``dry(config, lineage, runtime) -> (what it
#: resolved for its work, a result that did nothing)``, having refused what the step would refuse.
DryCore = Callable[[Any, Lineage, Runtime], tuple[dict[str, Any], ComponentResult]]


def run(
    name: str,
    model: type[BaseModel],
    core: Core,
    argv: Sequence[str] | None = None,
    doc: str = "",
    dry: DryCore | None = None,
) -> int:
    """Run one component: parse, validate, run the core, write outputs.

    Args:
        name: The component's name (folder, core function and CLI share it).
        model: The component's config model.
        core: ``core(config, lineage, runtime) -> result``: the settings, the lineage of its
            inputs, and what the platform set (policy, hardware profile, trusted code).
        argv: Arguments (default: ``sys.argv[1:]``).
        doc: Help text.
        dry: What the component does in a dry run (``TRAINPIPE_DRY_RUN``); without one, a dry run
            runs the step's work.

    Returns:
        The exit code.
    """
    parser = make_parser(name, model, doc)
    ns = vars(parser.parse_args(argv))
    prefix = f"trainpipe {name}"
    t0 = time.perf_counter()
    umask = current_umask()  # the step's own (the policy's output_umask restricts it): put back for a caller in process
    try:
        return _run_and_say(name, model, core, ns, prefix, dry, t0)
    finally:
        os.umask(umask)


def _run_and_say(
    name: str, model: type[BaseModel], core: Core, ns: dict[str, Any], prefix: str, dry: DryCore | None, t0: float
) -> int:
    with _stdout_to_stderr() as result_out:
        code, payload, result, message = _run(name, model, core, ns, prefix, dry)
        dry_now = dry is not None and dry_run.folder() is not None
        if not dry_now:
            _push(name, code, time.perf_counter() - t0, ns, payload, result)
        if code != EXIT_OK:
            if ns.get("error_record"):
                ErrorRecord(component=name, exit_code=code, message=message).write(ns["error_record"])
            return code
        said = f"dry run: what it received is in {dry_run.folder()}" if dry_now else result.summary()
        print(f"{prefix}: ok in {time.perf_counter() - t0:.1f}s: {said}", file=sys.stderr)
        result_out.write(json.dumps(payload, sort_keys=True, default=str) + "\n")
    return EXIT_OK


def _push(name: str, code: int, seconds: float, ns: dict[str, Any], payload: dict[str, Any], result: Any) -> None:
    """The run's batch-job figures to the Pushgateway, when the platform set one (never fails the run)."""
    if not os.environ.get(push.PUSHGATEWAY_ENV):
        return
    run_id = ns.get("run_id") or ((payload.get("lineage") or {}).get("orchestrator") or {}).get("run_id")
    push.push_component(
        name,
        code,
        seconds,
        run_id,
        result.figures() if result is not None else {},
        profile_label(os.environ.get(PROFILE_ENV) or "local"),
        series=result.series() if result is not None else [],
    )


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[typing.TextIO]:
    """Send everything libraries print to stderr; stdout carries only the result JSON."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    real = os.fdopen(os.dup(saved), "w", encoding="utf-8")
    try:
        yield real
    finally:
        sys.stdout.flush()
        real.flush()
        real.close()
        os.dup2(saved, 1)
        os.close(saved)


def _run(
    name: str, model: type[BaseModel], core: Core, ns: dict[str, Any], prefix: str, dry: DryCore | None = None
) -> tuple[int, dict[str, Any], Any, str]:
    """Returns ``(exit code, result payload, result, the failure's one line or "")``."""
    payload: dict[str, Any] = {}
    config: Any = None
    audit_log: Path | None = None
    try:
        from trainpipe.contract import audit

        runtime = Runtime.from_env()
        # before anything is written: what it writes and every process it starts (ranks, DVC) writes
        restrict_umask((policy := runtime.policy).output_umask)
        audit_log = audit.log_path(policy.audit_log)
        if audit_log is None and policy.require_audit:
            raise InputError(f"audit_log: the policy requires an audit log; set {audit.ENV} or the policy's audit_log")
        config = build(model, lay_settings(model, read_settings(model, ns, name)), where=name)
        check_artifact_paths(model, config)
        sources = source_fields(model)
        upstream = [
            artifacts.read_artifact(getattr(config, f), f).lineage
            for f in input_fields(model)
            if getattr(config, f)
            and Path(getattr(config, f)).is_dir()
            and not (f in sources and not (Path(getattr(config, f)) / artifacts.MARKER).exists())
        ]
        record = lineage_mod.merge(upstream).with_(**lineage_mod.run_sections(ns.get("orchestrator"), ns.get("run_id")))
        outs = {f: getattr(config, f) for f in output_fields(model) if getattr(config, f)}
        for f, out in outs.items():
            artifacts.begin_output(out, f)  # each named in its refusal
        runtime = runtime.trusting(getattr(config, "trusted_packages", None) or ())  # the step's own setting
        if dry is not None and dry_run.folder() is not None:
            received, result = dry(config, record, runtime)
            dry_run.record(name, config, runtime, ns, received)
        else:
            result = core(config, record, runtime)
        if name not in result.lineage.steps:
            result.lineage = result.lineage.with_(steps=[*result.lineage.steps, name])
        payload = result.model_dump(mode="json")
        final_lineage = payload["lineage"]
        for out in outs.values():
            artifacts.finish_output(out, name, payload, final_lineage)
        if audit_log is not None:
            _audit(audit_log, name, model, config, ns, payload, result, None)
        if ns.get("result"):
            atomic_write_json(ns["result"], payload)
    except TrainpipeError as exc:
        print(failure_line(prefix, exc), file=sys.stderr)
        if audit_log is not None:  # refused settings are an execution too: recorded without inputs
            try:
                _audit(audit_log, name, model, config, ns, payload, None, exc)
            except TrainpipeError as audit_exc:
                print(f"{prefix}: error: {audit_exc}", file=sys.stderr)
        return exc.exit_code, payload, None, str(exc)
    except KeyboardInterrupt:
        print(f"{prefix}: interrupted", file=sys.stderr)
        return 130, payload, None, "interrupted"
    except Exception as exc:
        import traceback

        traceback.print_exc()
        print(f"{prefix}: internal error (a bug in trainpipe; the traceback above says where)", file=sys.stderr)
        if audit_log is not None:
            with contextlib.suppress(TrainpipeError):
                _audit(
                    audit_log,
                    name,
                    model,
                    config,
                    ns,
                    payload,
                    None,
                    TrainpipeError(f"internal error: {type(exc).__name__}"),
                )
        return EXIT_INTERNAL, payload, None, f"internal error: {type(exc).__name__} (a bug in trainpipe)"
    return EXIT_OK, payload, result, ""


def failure_line(prefix: str, exc: TrainpipeError) -> str:
    """The one line a failed step prints: ``<prefix>: error: <why>``; a preemption is no error (its checkpoint
    is written and a retry resumes there), so it reads ``<prefix>: preempted ...`` and nothing more."""
    if isinstance(exc, Preempted):
        said = str(exc)
        return f"{prefix}: {said}" if said.startswith("preempted") else f"{prefix}: preempted: {said}"
    return f"{prefix}: error: {exc}"


def check_artifact_paths(model: type[BaseModel], config: BaseModel) -> None:
    """Refuse artifact paths that climb out with ``..``, that are URIs, or that lie outside the workspace.

    Components read and write local paths (KFP and Airflow mount object storage as
    files). When ``TRAINPIPE_WORKSPACE`` is set, every output, and every input artifact
    directory, must lie inside it. A source file the user names (the raw data) is exempt.

    Raises:
        InputError: naming the field and the path.
    """
    workspace = os.environ.get("TRAINPIPE_WORKSPACE")
    root = Path(workspace).resolve() if workspace else None
    for field in input_fields(model) + output_fields(model):
        value = getattr(config, field)
        if not value:
            continue
        if "://" in value:
            scheme = value.split("://", 1)[0]
            raise InputError(
                f"{field}: unsupported URI scheme {scheme + '://'!r} in {value!r} (a local path is expected; "
                "orchestrators mount object storage as files)"
            )
        p = Path(value).resolve()
        if field in input_fields(model) and (
            p.is_file() or (field in source_fields(model) and p.is_dir() and not (p / artifacts.MARKER).exists())
        ):
            continue  # raw data the user names (a file, a folder of Parquet files) may live anywhere it can be read
        if field in input_fields(model) and not p.exists():
            raise InputError(f"{field}: {value!r} does not exist")  # not "climbs out": a missing file is the news
        if ".." in Path(value).parts:
            raise InputError(
                f"{field}: {value!r} climbs out with '..' (path traversal is refused; give the path itself)"
            )
        if root is not None and not p.is_relative_to(root):
            raise InputError(f"{field}: {value!r} is outside the workspace {str(root)!r} (TRAINPIPE_WORKSPACE)")


def _audit(
    log: Path,
    name: str,
    model: type[BaseModel],
    config: BaseModel | None,
    ns: dict[str, Any],
    payload: dict[str, Any],
    result: Any,
    exc: TrainpipeError | None,
) -> None:
    """Append this execution (and any gate decision or alias change it made) to the audit log."""
    from trainpipe.contract import audit
    from trainpipe.contract.io import file_digest

    def ref(field: str) -> dict[str, Any]:
        p = Path(getattr(config, field))
        if p.is_file():
            return {"path": str(p), "md5": file_digest(p)}
        return {"path": str(p), "marker_sha256": audit.artifact_hash(p)}

    base = {
        "component": name,
        "who": audit.identity(),
        "run": {
            "orchestrator": ns.get("orchestrator") or os.environ.get("TRAINPIPE_ORCHESTRATOR") or "manual",
            "run_id": ns.get("run_id"),
        },
    }
    execution = {
        **base,
        "action": "execute",
        "status": "ok" if exc is None else "failed",
        "inputs": {f: ref(f) for f in input_fields(model) if getattr(config, f)} if config is not None else {},
        "outputs": {f: ref(f) for f in output_fields(model) if getattr(config, f)}
        if exc is None and config is not None
        else {},
        "result_sha256": audit.payload_hash(payload) if exc is None else None,
    }
    if exc is not None:
        execution["error"] = {"exit_code": exc.exit_code, "message": str(exc)}
    events = [execution]
    if result is not None:
        events += [{**base, **e} for e in result.audit_events()]
    audit.append(log, events)


def main(name: str, model: type[BaseModel], core: Core, doc: str = "", dry: DryCore | None = None) -> None:
    """``python -m`` entry: run and exit with the documented code."""
    exit_now(run(name, model, core, doc=doc, dry=dry))


def exit_now(code: int) -> None:
    """Exit once the step's work is done and its output written, without tearing down every module
    the step imported: tearing down MLflow, SQLAlchemy, GX or DVC module by module is slow and does
    nothing a finished step needs. Exit handlers still run and output is flushed;
    while a non-daemon thread is alive, the ordinary exit waits for it instead."""
    import atexit
    import threading

    if any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not threading.main_thread()):
        sys.exit(code)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)
