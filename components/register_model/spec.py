"""register_model: typed config and result. Imports nothing heavy."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from trainpipe.contract.config import StrictModel
from trainpipe.contract.entrypoint import INPUT, OUTPUT, SAME_AS_PRODUCER
from trainpipe.contract.result import ComponentResult
from trainpipe.services.registry import ALIAS_PATTERN, CHALLENGER, DEFAULT_ALIAS

NAME = "register_model"
LINEAGE_FILE = "lineage.json"
MODEL_CARD_FILE = "model_card.md"


class RegisterModelParams(StrictModel):
    """Settings of register_model that are not artifacts."""

    model_name: str = Field(
        "trainpipe-model",
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,254}$",
        description="registered model name",
        json_schema_extra={SAME_AS_PRODUCER: "decision"},  # the model the gate compared with
    )
    alias: str = Field(
        DEFAULT_ALIAS,
        pattern=ALIAS_PATTERN,
        description="the serving alias: it moves to the new version only when the gate decided against the current "
        "holder (or none exists)",
        json_schema_extra={SAME_AS_PRODUCER: "decision"},  # the alias whose holder the gate compared with
    )
    challenger_alias: str = Field(CHALLENGER, pattern=ALIAS_PATTERN, description="alias every new registration gets")
    intended_use: str = Field(
        "Predictions on rows shaped like the training snapshot. Not assessed for other populations or for decisions "
        "about people without review.",
        max_length=4000,
        description="the model card's intended-use statement",
    )
    tracking_uri: str | None = Field(None, description="MLflow tracking URI (default: MLFLOW_TRACKING_URI)")
    move_alias: bool = Field(
        True,
        description="move the serving alias when the gate decided so; False (the pipeline's require_approval): "
        "register the "
        "challenger only, and a person moves the alias later (`trainpipe promote`, or the DAG's approval)",
    )
    optimized_model_name: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,254}$",
        description="registered model the optimized (ONNX) variant goes to, beside the fp32 one (default: "
        "<model_name>-onnx)",
    )


class RegisterModelConfig(RegisterModelParams):
    """Everything register_model needs, artifacts included."""

    model: str = Field(
        ..., min_length=1, description="the model artifact (train_model's output)", json_schema_extra=INPUT
    )
    decision: str = Field(
        ..., min_length=1, description="the gate decision (evaluate_model's output)", json_schema_extra=INPUT
    )
    training_profile: str | None = Field(
        None, description="profile_training's output, for the lineage", json_schema_extra=INPUT
    )
    optimized: str | None = Field(
        None,
        description="optimize_model's output: its accepted variant is registered beside the model, with "
        "the same aliases",
        json_schema_extra=INPUT,
    )
    output_dir: str = Field(
        ..., min_length=1, description="where the registration record goes", json_schema_extra=OUTPUT
    )


class RegisterModelResult(ComponentResult):
    """What register_model reports."""

    registered: bool = Field(description="whether a model version was registered (a failed gate registers none)")
    created: bool = Field(description="False when an identical version already existed (idempotent rerun)")
    model_name: str = Field(description="the registered model's name")
    version: str | None = Field(description="the version registered (or found, on a rerun)")
    alias: str | None = Field(description="the alias moved to it, if any")
    model_uri: str | None = Field(description="models:/ URI of the version")
    aliases: list[str] = Field(default_factory=list, description="aliases now pointing at this version")
    champion_moved: bool = Field(False, description="whether the alias now points at this version")
    aliases_set: list[str] = Field(default_factory=list, description="aliases this run pointed at the version")
    reason: str = Field(description="why it was or was not registered and promoted")
    optimized_version: str | None = Field(
        None, description="the version of optimized_model_name made (or found) from optimize_model's variant"
    )
    optimized_model_uri: str | None = Field(
        None, description="models:/ URI of the optimized variant, where one was registered"
    )
    signature_sha256: str | None = Field(
        None, description="sha256 of the version's signature (model.sig), when the platform signs"
    )
    optimized_signature_sha256: str | None = Field(
        None, description="sha256 of the optimized model's signed file, where signed"
    )

    def audit_events(self) -> list[dict[str, Any]]:
        """Each alias this run set, as a record of the audit trail."""
        if not self.registered:
            return []
        events = [
            {"action": "sign", "decision": {"model_name": model, "version": version, "signature_sha256": sha}}
            for model, version, sha in (
                (self.model_name, self.version, self.signature_sha256),
                (
                    self.lineage.optimization.model_name if self.lineage.optimization else None,
                    self.optimized_version,
                    self.optimized_signature_sha256,
                ),
            )
            if sha
        ]
        events += [
            {
                "action": "alias",
                "decision": {
                    "model_name": self.model_name,
                    "version": self.version,
                    "alias": a,
                    "new_version": self.created,
                },
            }
            for a in self.aliases_set
        ]
        if self.optimized_version is not None:
            opt = self.lineage.optimization
            events += [
                {
                    "action": "alias",
                    "decision": {
                        "model_name": opt.model_name if opt else None,
                        "version": self.optimized_version,
                        "alias": a,
                        "parent_version": self.version,
                    },
                }
                for a in self.aliases_set
            ]
        return events

    def summary(self) -> str:
        if not self.registered:
            return f"not registered: {self.reason}"
        line = f"{self.model_uri} (version {self.version}, {'new' if self.created else 'existing'})"
        return line + (f"; optimized {self.optimized_model_uri}" if self.optimized_model_uri else "")
