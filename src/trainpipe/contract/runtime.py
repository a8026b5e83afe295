"""What the platform tells a step besides its settings, read once by the entrypoint and handed to
the core as an argument: the policy in force, the hardware profile the step runs on, and the team
packages whose model code may be imported. A core reads no environment for these; called directly
(a test, a notebook), it is given them. Stdlib and pydantic only."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from trainpipe.contract.policy import Policy, load_policy

#: The hardware profile a step runs on (the compiler and the DAG set it on the training step).
PROFILE_ENV = "TRAINPIPE_HARDWARE_PROFILE"
#: Team packages whose model code steps may import to rebuild a model (comma-separated).
TRUSTED_CODE_ENV = "TRAINPIPE_TRUSTED_MODEL_CODE"


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

    def trusts(self, module: str) -> bool:
        """Whether a model may be rebuilt by importing ``module`` (it, or a package it is in, is trusted)."""
        return any(module == m or module.startswith(m + ".") for m in self.trusted_code)
