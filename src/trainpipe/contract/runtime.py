"""What the platform tells a step besides its settings, read once by the entrypoint and handed to
the core as an argument: the policy in force, the hardware profile the step runs on, and the team
packages whose model code may be imported. A core reads no environment for these; called directly
(a test, a notebook), it is given them. Stdlib and pydantic only."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Annotated

from pydantic import Field, StringConstraints

from trainpipe.contract.config import load_file, parse_json
from trainpipe.contract.policy import Policy, load_policy

#: The hardware profile a step runs on: a built-in's name, a profile file's path, or a profile's JSON (the
#: compiled pipeline and the DAGs set a file's content on the steps that read it:
#: ``trainpipe.services.profiles.to_env``).
PROFILE_ENV = "TRAINPIPE_HARDWARE_PROFILE"
#: Team packages whose model code steps may import to rebuild a model (comma-separated).
TRUSTED_CODE_ENV = "TRAINPIPE_TRUSTED_MODEL_CODE"


def profile_label(value: str) -> str:
    """What a step records as its hardware profile (the lineage, the metric labels, a dry run): the
    profile's own ``name`` where ``value`` is its content (JSON) or its file; else ``value`` itself
    (a built-in's name, ``local``: no profile). A profile that cannot be read is named by ``value``
    (a label never fails a run). ``trainpipe.services.profiles`` validates profiles; this only names one."""
    try:
        if value.lstrip().startswith("{"):
            doc = parse_json(value, PROFILE_ENV)
        elif value.endswith((".yaml", ".yml", ".json")):
            doc = load_file(value)
        else:
            return value
    except Exception:  # noqa: BLE001 (a label never fails a run)
        return value
    name = doc.get("name") if isinstance(doc, dict) else None
    return name if isinstance(name, str) and name else value


#: What a trusted package is named by: a top-level package or module (``teampkg``, ``acme.models``).
PACKAGE_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$"


#: The ``trusted_packages`` setting of every step that rebuilds a team's model from its code (each spec
#: declares it with this type): the packages it may import, beside what the platform trusts.
TrustedPackages = Annotated[
    list[Annotated[str, StringConstraints(pattern=PACKAGE_PATTERN)]],
    Field(
        default_factory=list,
        description="team packages whose model code this step may import to rebuild a model (a pipeline sets the "
        "package of its train_function; the platform's TRAINPIPE_TRUSTED_MODEL_CODE is trusted too)",
    ),
]


@dataclass(frozen=True)
class Runtime:
    """The platform's settings for one step."""

    policy: Policy = field(default_factory=Policy)
    hardware_profile: str = "local"
    trusted_code: tuple[str, ...] = ()

    @classmethod
    def from_env(cls) -> Runtime:
        """What the orchestrator set: ``TRAINPIPE_POLICY``, ``TRAINPIPE_HARDWARE_PROFILE``,
        ``TRAINPIPE_TRUSTED_MODEL_CODE``.

        Raises:
            InputError: the policy cannot be read.
        """
        trusted = tuple(m.strip() for m in os.environ.get(TRUSTED_CODE_ENV, "").split(",") if m.strip())
        return cls(policy=load_policy(), hardware_profile=os.environ.get(PROFILE_ENV) or "local", trusted_code=trusted)

    def trusting(self, packages: tuple[str, ...] | list[str]) -> Runtime:
        """The same runtime, also trusting ``packages`` (a step's ``trusted_packages`` setting)."""
        import dataclasses

        more = tuple(p for p in packages if not self.trusts(p))
        return dataclasses.replace(self, trusted_code=(*self.trusted_code, *more)) if more else self

    def trusts(self, module: str) -> bool:
        """Whether a model may be rebuilt by importing ``module`` (it, or a package it is in, is trusted)."""
        return any(module == m or module.startswith(m + ".") for m in self.trusted_code)
