"""register_model: the work. mlflow and torch are imported inside the functions."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from trainpipe.components.register_model.spec import (
    LINEAGE_FILE,
    MODEL_CARD_FILE,
    NAME,
    RegisterModelConfig,
    RegisterModelResult,
)
from trainpipe.contract import lineage as lineage_mod
from trainpipe.contract.errors import AliasMoved, InputError, TrainpipeError
from trainpipe.contract.io import atomic_write_json, atomic_write_text, file_digest, read_json
from trainpipe.contract.layout import (
    DECISION_FILE,
    MODEL_FILE,
    MODEL_META,
    ONNX_FILE,
    OPTIMIZATION_FILE,
    OPTIMIZED_MODEL_DIR,
)
from trainpipe.contract.lineage import Lineage, RegistrationLineage
from trainpipe.contract.runtime import Runtime
from trainpipe.services import registry, signing

HASH_TAG = registry.HASH_TAG
#: The sections of the chain a model may come without (a team's DAG without those steps): the registration
#: names the ones it lacks, and the model card says what that means.
CHAIN = ("validation", "snapshot")
DATA_TAG = registry.DATA_TAG


def version_tags(lineage: Lineage, sha256: str, md5: str, run_id: str) -> dict[str, str]:
    """A new version's tags: the lineage flattened (each value within MLflow's tag limit), and the
    model hash, the data hash and the training run that make a rerun find it again."""
    tags = {k: v[:5000] for k, v in lineage_mod.flatten(lineage).items()}
    tags.update({HASH_TAG: sha256, DATA_TAG: md5, registry.RUN_TAG: run_id})
    return tags


def find_existing(client: Any, name: str, model_sha256: str, dataset_md5: str) -> Any | None:
    """The version already registered for this exact model and data, if any."""
    for mv in client.search_model_versions(f"name = '{name}'"):
        if mv.tags.get(HASH_TAG) == model_sha256 and mv.tags.get(DATA_TAG) == dataset_md5:
            return mv
    return None


def check_same_alias(config: RegisterModelConfig, decision: dict[str, Any]) -> None:
    """The gate compared the model with the version under one alias of one model: register_model moves that
    alias of that model, or refuses (a pipeline that set ``alias`` on one step only would otherwise pass
    the gate as "no champion yet" and leave the alias it meant where it was).

    Raises:
        InputError: the steps disagree on the model or the alias (one line naming both).
    """
    for name, theirs in (("model_name", decision.get("model_name")), ("alias", decision.get("alias"))):
        mine = getattr(config, name)
        if theirs is not None and theirs != mine:
            raise InputError(
                f"{name}: register_model would move {config.alias!r} of {config.model_name!r}, but evaluate_model "
                f"compared the model with {decision.get('alias')!r} of {decision.get('model_name')!r}; give both "
                f"steps the same {name}"
            )


def should_move_champion(
    decision: dict[str, Any],
    current: Any | None,
    version: str,
    alias: str = registry.DEFAULT_ALIAS,
    *,
    reused_from: str | None = None,
    recompare: Callable[[Any], tuple[bool | None, str]] | None = None,
    model_name: str = "",
) -> tuple[bool, str]:
    """Whether the serving alias moves to ``version``. It only moves forward: to a version the gate found
    strictly better than its holder now (``current``), or when nobody held it when the gate looked and
    nobody holds it now; never to a version older than the holder, nor to an identical model registered
    before by another training run (``reused_from``). Called under the alias's lease, so the holder cannot
    change between this and the move.

    When the holder changed since the gate compared (a lost race), the model is compared once with the new
    holder (``recompare(current)``: better, not better, or None when the two cannot be compared).

    Args:
        reused_from: The training run of the identical version reused (None: this run registered it).
        recompare: Compares the model with another holder: ``(better or None, how)``.
        model_name: The registered model, for the operator's line.

    Returns:
        ``(move, why)``.

    Raises:
        AliasMoved: the alias moved since the gate compared and the model could not be compared with its new
            holder, or is better but older (the line says what an operator does next).
    """
    champ = decision.get("champion") or {}
    held = f"at version {current.version}" if current is not None else "unset"
    if current is not None and str(current.version) == str(version):
        return False, f"this version already is {alias}"
    if reused_from is not None:
        return False, (
            f"an identical model on the same data was registered before as version {version} (training run "
            f"{reused_from}): reused, and {alias} stays {held}"
        )
    if current is None:
        return True, f"no {alias} yet: this version becomes {alias}"
    compared = str(champ.get("version")) if champ else None
    older = _older(version, str(current.version))
    if decision.get("beats_champion") and compared == str(current.version):
        if older:
            return (
                False,
                f"version {version} is older than {alias} version {current.version}: {alias} only moves forward",
            )
        return True, f"the gate found it better than {alias} version {current.version}"
    saw_none = decision.get("model_name") and not champ and decision.get("passed")  # it looked: nobody held it
    if not (decision.get("beats_champion") or saw_none):
        return False, (
            f"the gate did not find it better than {alias} version {current.version}: registered as challenger only"
        )
    lost = (
        f"the gate compared the model with {f'version {compared}' if champ else 'no version'} under {alias!r}, but "
        f"{alias} is now version {current.version} (another registration or a promotion moved it since)"
    )
    better, how = recompare(current) if recompare is not None else (None, "nothing to compare with")
    uri = f"models:/{model_name}/{version}" if model_name else f"version {version}"
    if better is False:
        return False, f"{lost}; compared once with version {current.version}: not better ({how}): challenger only"
    if better and not older:
        return True, f"{lost}; compared once with version {current.version}: better ({how}): {alias} moves"
    why = (
        f"better than it ({how}) but older, and {alias} only moves forward"
        if better
        else f"they cannot be compared ({how})"
    )
    raise AliasMoved(
        f"alias: {lost}; {why}: not moved to version {version}, which is registered as challenger. Next: run the "
        f"pipeline again (its gate compares a new model with version {current.version}), or have a person review "
        f"it and run `trainpipe promote {uri} --reason ...`"
    )


def _older(version: str, than: str) -> bool:
    """Whether registered version ``version`` came before ``than`` (MLflow numbers versions 1, 2, ...)."""
    try:
        return int(version) < int(than)
    except ValueError:
        return False


def holder_comparison(
    client: Any, decision: dict[str, Any], md5: str, meta: dict[str, Any], alias: str
) -> Callable[[Any], tuple[bool | None, str]]:
    """How a model that lost the race is compared with the alias's new holder: with the metrics the holder's
    own gate recorded on its version, when they were taken on the same held-out rows (the same dataset and
    the same split) under the rules this model's gate used; None where that cannot be said."""
    from trainpipe.services import gate

    prefix = "lineage.evaluation.metrics."

    def compare(current: Any) -> tuple[bool | None, str]:
        tags = dict(getattr(current, "tags", None) or {})
        if "rules" not in decision:
            return None, "this model's decision carries no comparison rules"
        if not md5 or tags.get(registry.DATA_TAG) != md5:
            return None, f"version {current.version} was evaluated on another dataset"
        split = registry.version_meta(client, current).get("split")
        if not split or split != meta.get("split"):
            return None, f"version {current.version} was evaluated on other held-out rows (another split)"
        theirs = {k[len(prefix) :]: float(v) for k, v in tags.items() if k.startswith(prefix) and v not in ("", None)}
        ours = {k: round(float(v), 6) for k, v in (decision.get("metrics") or {}).items()}  # as its tags hold them
        found = gate.compare(ours, theirs, f"{alias} version {current.version}", gate.Rules.of(decision["rules"]))
        return found.better, "; ".join(found.failures or found.reasons)

    return compare


def model_card(
    config: RegisterModelConfig, version: str, decision: dict[str, Any], record: Lineage, meta: dict[str, Any]
) -> str:
    """The model card: what the model is for, what it was trained on, how it scored, why it was accepted."""
    lineage = record.to_dict()
    snap, train, ev = lineage.get("snapshot", {}), lineage.get("training", {}), lineage.get("evaluation", {})
    source = lineage.get("source", {})
    metrics = "\n".join(
        f"| {k} | {v:.4f} |" for k, v in sorted(decision.get("metrics", {}).items()) if isinstance(v, (int, float))
    )
    reasons = "\n".join(f"- {r}" for r in decision.get("reasons", []))
    champ = decision.get("champion") or {}
    alias = decision.get("alias") or config.alias
    compared = (
        f"Compared with {alias} version {champ.get('version')} on the same held-out rows."
        if decision.get("compared_with_champion")
        else f"Not compared with a {alias} version (none existed, or it could not be scored): decided by the "
        "absolute thresholds."
    )
    classes = ", classes: " + ", ".join(map(str, meta["classes"])) if meta.get("classes") else ""
    columns = meta.get("feature_columns", [])
    shown = ", ".join(columns[:8]) + (", …" if len(columns) > 8 else "")
    ran = f"{train.get('backend')} on {train.get('world_size')} x {train.get('device')} ({train.get('dist_backend')})"
    validated = (
        f"validated by suite `{lineage['validation'].get('suite', '')}`"
        if lineage.get("validation")
        else "not validated (no validate_data ran)"
    )
    snapshot = (
        f"DVC md5 `{snap.get('md5')}`, revision `{snap.get('rev', '')}`, remote `{snap.get('remote', '')}`"
        if snap
        else "none (no snapshot_dataset ran): the exact training data cannot be fetched again, nor this lineage "
        "verified"
    )
    split = meta.get("split", {})
    return f"""# Model card: {config.model_name} version {version}

## Intended use
{config.intended_use}

## Model
- Built by: `{meta.get("builder")}` from training function `{meta.get("train_function")}` \
({meta.get("task", "classification")}){classes}
- Inputs: {len(columns)} feature columns ({shown}); label `{meta.get("label_column")}`
- Trained with: {ran}, precision {train.get("precision", "fp32")}
- Weights sha256: `{train.get("model_sha256")}`; MLflow training run `{train.get("mlflow_run_id")}`

## Data
- Source: `{source.get("uri", "")}` (md5 `{source.get("md5", "")}`), {validated}
- Snapshot: {snapshot}
- Held-out split: {int(100 * split.get("test_fraction", 0))}% (seed {split.get("seed")}), {ev.get("n_test")} rows

## Evaluation
| metric | value |
|---|---|
{metrics}

## Gate decision: {"passed" if decision.get("passed") else "NOT passed"}
{compared}

{reasons}

## Lineage
The full record is `trainpipe/lineage.json` beside this card and the `lineage.*` tags of the
version; `trainpipe lineage models:/{config.model_name}/{version}` prints and verifies it.
"""


def register_model(
    config: RegisterModelConfig, lineage: Lineage, runtime: Runtime | None = None
) -> RegisterModelResult:
    """Register the model when its gate passed; idempotent for identical model and data.

    Every new version gets the ``challenger`` alias; the serving alias (``champion``)
    moves to it only when the gate decided against the current champion, or when there
    is none. The version carries the lineage (tags and ``lineage.json``), a model card,
    a signature and input example, and a weights-only copy a later gate compares with.

    Args:
        config: Settings and paths.
        lineage: The merged lineage of the model, the decision and the training profile.
        runtime: The platform's settings: the registry's artifact store is checked against its policy.

    Returns:
        The version, its aliases and ``models:/`` URI, or why nothing was registered.

    Raises:
        InputError: the decision or model artifact is unreadable.
        AliasMoved: the gate decided to move the serving alias, but it moved since (the version is registered).
        ServiceUnavailable: MLflow cannot be reached, or another registration held the alias's lease too long.
    """
    decision = read_json(Path(config.decision) / DECISION_FILE)
    check_same_alias(config, decision)
    lineage = Lineage.of(lineage)
    policy = (runtime or Runtime()).policy
    if not decision.get("passed"):
        return _not_registered(config, decision, lineage)
    lineage, training, md5, sha, meta = _checked_model(config, lineage)
    done = _register(config, lineage, decision, policy, training, md5, sha, meta)
    return _recorded(config, lineage, decision, meta, done)


class _Registration(NamedTuple):
    """What registering in MLflow did: the version, whether it was new, its signature, the optimized variant's
    ``(name, version, signature)``, the alias decision and the aliases the version holds now."""

    version: str
    created: bool
    signature: str | None
    optimized: tuple[str, str, str | None] | None
    move: bool
    why: str
    aliases_set: list[str]
    aliases: list[str]


def _checked_model(config: RegisterModelConfig, lineage: Lineage) -> tuple[Lineage, Any, str, str, dict[str, Any]]:
    """The model artifact checked against its training run: the lineage (with what its chain lacks), the training
    run, the data's md5, the weights' sha256 and the model's description.

    Raises:
        InputError: the lineage has no training run, or the weights are not the ones train_model recorded.
    """
    training, snapshot = lineage.training, lineage.snapshot
    if training is None:
        raise InputError("model: its lineage lacks the training run; it was not made by train_model")
    md5 = snapshot.md5 if snapshot is not None else ""  # with the model's hash, what makes a rerun find its version
    lacks = [section for section in CHAIN if getattr(lineage, section) is None] or None
    lineage = lineage.with_(registration=RegistrationLineage(lacks=lacks)) if lacks else lineage  # on the version too
    sha = file_digest(Path(config.model) / MODEL_FILE, "sha256")
    if sha != training.model_sha256:
        raise InputError(
            "model: model.safetensors does not match the hash train_model recorded (the artifact was changed)"
        )
    return lineage, training, md5, sha, read_json(Path(config.model) / MODEL_META)


def _register(
    config: RegisterModelConfig,
    lineage: Lineage,
    decision: dict[str, Any],
    policy: Any,
    training: Any,
    md5: str,
    sha: str,
    meta: dict[str, Any],
) -> _Registration:
    """The version found or created, signed, its optimized variant registered beside it, and the aliases set.

    Raises:
        AliasMoved: the serving alias moved since the gate decided (the version is registered).
        ServiceUnavailable: MLflow cannot be reached, or another registration held the alias's lease too long.
    """
    from trainpipe.services import tracking

    client = tracking.connect(config.tracking_uri, policy)
    tracking.prepare_artifact_store(client, policy, training.mlflow_run_id)
    try:
        existing = find_existing(client, config.model_name, sha, md5)
        created = existing is None
        version = (
            existing.version
            if existing is not None
            else _create_version(client, config, lineage, decision, meta, sha, md5, training.mlflow_run_id)
        )
        version = str(version)
        # signed before any alias points at it: a serving alias never names an unsigned version
        signature = (
            registry.sign_version(client, config.model_name, version, sha, MODEL_FILE)
            if signing.signing_enabled()
            else None
        )
        optimized = register_optimized(client, config, lineage, version, md5, training) if config.optimized else None
        variant = (optimized[0], optimized[1]) if optimized else None
        ran = existing.tags.get(registry.RUN_TAG) if existing is not None else None
        reused_from = (ran or "unknown") if existing is not None and ran != training.mlflow_run_id else None
        compare = holder_comparison(client, decision, md5, meta, config.alias)
        move, why, aliases_set = set_aliases(client, config, decision, version, created, variant, reused_from, compare)
        aliases = sorted(client.get_model_version(config.model_name, version).aliases)
    except TrainpipeError:
        raise
    except Exception as exc:
        raise tracking.classify(exc, f"tracking_uri: registering {config.model_name!r} in MLflow", "failed") from None
    return _Registration(version, created, signature, optimized, move, why, aliases_set, aliases)


def _recorded(
    config: RegisterModelConfig, lineage: Lineage, decision: dict[str, Any], meta: dict[str, Any], done: _Registration
) -> RegisterModelResult:
    """The registration's lineage and model card written to the output folder, and the step's result."""
    version, aliases, optimized, signature = done.version, done.aliases, done.optimized, done.signature
    alias = (
        config.alias
        if config.alias in aliases
        else (config.challenger_alias if config.challenger_alias in aliases else None)
    )
    uri = f"models:/{config.model_name}@{alias}" if alias else f"models:/{config.model_name}/{version}"
    lacks = [section for section in CHAIN if getattr(lineage, section) is None] or None
    lineage = lineage.with_(
        registration=RegistrationLineage(
            model_name=config.model_name,
            version=version,
            aliases=aliases,
            champion_moved=done.move,
            signature_sha256=signature,
            lacks=lacks,
        )
    )
    if optimized is not None and lineage.optimization is not None:
        lineage = lineage.with_(
            optimization=lineage.optimization.model_copy(update={"model_name": optimized[0], "version": optimized[1]})
        )
    out = Path(config.output_dir)
    atomic_write_json(out / LINEAGE_FILE, lineage.to_dict())
    atomic_write_text(out / MODEL_CARD_FILE, model_card(config, version, decision, lineage, meta))
    return RegisterModelResult(
        registered=True,
        created=done.created,
        model_name=config.model_name,
        version=version,
        alias=alias,
        aliases=aliases,
        champion_moved=done.move,
        aliases_set=done.aliases_set,
        model_uri=uri,
        reason=("gate passed; " if done.created else "identical model and data already registered; ") + done.why,
        optimized_version=optimized[1] if optimized else None,
        optimized_model_uri=f"models:/{optimized[0]}/{optimized[1]}" if optimized else None,
        signature_sha256=signature,
        optimized_signature_sha256=optimized[2] if optimized else None,
        lineage=lineage,
    )


def _not_registered(config: RegisterModelConfig, decision: dict[str, Any], lineage: Lineage) -> RegisterModelResult:
    """The result of a model whose gate did not pass: nothing registered, and why."""
    reason = "gate not passed: " + "; ".join(decision.get("failures") or decision.get("reasons", []))
    return RegisterModelResult(
        registered=False,
        created=False,
        model_name=config.model_name,
        version=None,
        alias=None,
        model_uri=None,
        reason=reason,
        lineage=lineage.with_(registration=RegistrationLineage(registered=False)),
    )


def set_aliases(
    client: Any,
    config: RegisterModelConfig,
    decision: dict[str, Any],
    version: str,
    created: bool,
    variant: tuple[str, str] | None,
    reused_from: str | None = None,
    recompare: Callable[[Any], tuple[bool | None, str]] | None = None,
) -> tuple[bool, str, list[str]]:
    """The challenger alias on a new version, and the serving alias when the gate decided against its
    holder (or there is none) and no approval is required, each on the version and its optimized
    ``variant`` (``(name, version)``) alike: ``(moved, why, the aliases set)``.

    Every alias is set under the model's lease (:func:`trainpipe.services.registry.alias_lease`), which
    ``trainpipe promote`` holds too: the serving alias moves by compare-and-set (its holder read again
    under the lease, so no other move comes between what the gate compared with and the move), and two
    registrations never set the challenger alias at once (MLflow's upsert of an alias then fails on its
    unique key).

    Args:
        reused_from: The training run of the identical version reused (another run's: the alias stays).
        recompare: Compares the model with a holder other than the gate's (:func:`holder_comparison`).

    Raises:
        AliasMoved: the holder is not the version the gate compared with, and the model could not be shown
            better than it (the challenger alias is set).
    """
    targets = [(config.model_name, version), *([variant] if variant else [])]
    aliases_set = [config.challenger_alias] if created else []
    with registry.alias_lease(client, config.model_name):
        for name, v in targets:
            for alias in aliases_set:
                client.set_registered_model_alias(name, alias, v)
        current = registry.alias_version(client, config.model_name, config.alias)
        checks = {"reused_from": reused_from, "model_name": config.model_name}
        if not config.move_alias:
            return False, _held_for_approval(config, decision, current, version, checks), aliases_set
        move, why = should_move_champion(
            decision,
            current,
            version,
            config.alias,
            recompare=recompare,
            reused_from=reused_from,
            model_name=config.model_name,
        )
        for name, v in targets if move else ():
            client.set_registered_model_alias(name, config.alias, v)
    return move, why, aliases_set + ([config.alias] if move else [])


def _held_for_approval(
    config: RegisterModelConfig, decision: dict[str, Any], current: Any, version: str, checks: dict[str, Any]
) -> str:
    """Why the serving alias did not move with ``move_alias`` off: a person approves first, or the gate
    did not decide to move it."""
    try:
        move, why = should_move_champion(decision, current, version, config.alias, **checks)
    except AliasMoved as exc:
        return str(exc)
    if not move:
        return why
    return (
        f"registered as challenger only: with require_approval the {config.alias} alias moves after a person approves "
        f"(`trainpipe promote models:/{config.model_name}/{version}`)"
    )


def register_optimized(
    client: Any,
    config: RegisterModelConfig,
    lineage: Lineage,
    parent_version: str,
    md5: str,
    training: Any,
) -> tuple[str, str, str | None] | None:
    """Register optimize_model's accepted variant as a version of ``optimized_model_name`` (an MLflow
    pyfunc on onnxruntime), tagged with its parent version; the parent version is tagged with it (the
    aliases set on the parent go on it too, :func:`set_aliases`). Idempotent like the parent. None when
    no variant was accepted.

    Raises:
        InputError: the optimized artifact is incomplete, changed since optimize_model wrote it, or was
            made from another model.
    """
    import mlflow

    from trainpipe.services.serving import package

    assert config.optimized is not None, "called only with an optimized input"
    record = read_json(Path(config.optimized) / OPTIMIZATION_FILE)
    if not record.get("selected"):
        return None
    folder = Path(config.optimized) / OPTIMIZED_MODEL_DIR
    meta = read_json(folder / MODEL_META)
    sha = file_digest(folder / ONNX_FILE, "sha256")
    if sha != record.get("model_sha256"):
        raise InputError(
            "optimized: model.onnx does not match the hash optimize_model recorded (the artifact was changed)"
        )
    if (meta.get("parent") or {}).get("model_sha256") != training.model_sha256:
        raise InputError("optimized: it was made from another model than the one being registered")
    name = config.optimized_model_name or f"{config.model_name}-onnx"
    existing = find_existing(client, name, sha, md5)
    if existing is not None:
        version = str(existing.version)
    else:
        uri = package.log_onnx_model(training.mlflow_run_id, folder)
        tags = version_tags(lineage, sha, md5, training.mlflow_run_id)
        tags.update(
            {registry.PARENT_TAG: f"{config.model_name}/{parent_version}", "trainpipe.variant": str(meta["variant"])}
        )
        version = str(mlflow.register_model(uri, name, tags=tags).version)
        client.update_model_version(
            name,
            version,
            description=f"{meta['variant']} of {config.model_name} version {parent_version} "
            f"(optimize_model; figures in the lineage tags)",
        )
    signature = registry.sign_version(client, name, version, sha, ONNX_FILE) if signing.signing_enabled() else None
    client.set_model_version_tag(config.model_name, parent_version, registry.OPTIMIZED_TAG, f"{name}/{version}")
    return name, version, signature


def _create_version(
    client: Any,
    config: RegisterModelConfig,
    lineage: Lineage,
    decision: dict[str, Any],
    meta: dict[str, Any],
    sha: str,
    md5: str,
    run_id: str,
) -> str:
    """A new version from the MLflow model train_model logged (it loads without trainpipe), with the
    lineage as tags and ``lineage.json`` and the model card beside it in the training run."""
    import mlflow

    model_uri = lineage.training.model_uri if lineage.training else ""
    if not model_uri:
        raise InputError(
            "model: its lineage names no MLflow model (train_model logs one); it was not made by this version of "
            "train_model"
        )
    with mlflow.start_run(run_id=run_id), tempfile.TemporaryDirectory() as tmp:
        atomic_write_json(Path(tmp) / LINEAGE_FILE, lineage.to_dict())
        mlflow.log_artifact(str(Path(tmp) / LINEAGE_FILE), artifact_path="trainpipe")
    tags = version_tags(lineage, sha, md5, run_id)
    mv = mlflow.register_model(model_uri, config.model_name, tags=tags)
    version = str(mv.version)
    with mlflow.start_run(run_id=run_id), tempfile.TemporaryDirectory() as tmp:
        atomic_write_text(Path(tmp) / MODEL_CARD_FILE, model_card(config, version, decision, lineage, meta))
        mlflow.log_artifact(str(Path(tmp) / MODEL_CARD_FILE), artifact_path="trainpipe")
    client.update_model_version(
        config.model_name, version, description=f"Model card: runs:/{run_id}/trainpipe/{MODEL_CARD_FILE}"
    )
    return version


__all__ = ["NAME", "find_existing", "model_card", "register_model", "should_move_champion"]
