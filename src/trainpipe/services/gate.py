"""The comparison with the serving alias's holder: whether a model is strictly better than it.

evaluate_model decides its gate with it, and register_model compares once more with it when the alias
moved between the gate and the registration (a lost race): one rule, in the library, so the two steps
never disagree on what "better" means. Pure functions; imports nothing heavy.

The alias only moves forward: a model beats the holder only when every comparison rule passes and at
least one compared metric is better by more than ``tie_tolerance``. A tie (every difference within
it) keeps the holder.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from trainpipe.data.scoring import LOWER_IS_BETTER


@dataclass(frozen=True)
class Rules:
    """How a model is compared with the holder.

    Attributes:
        min_improvement: Per metric, how much better the model must be.
        max_regression: Per metric, how much worse it may be.
        tie_tolerance: A compared metric counts as better only when better by more than this (0: any
            difference); a tie on every compared metric keeps the holder.
        lower_is_better: The metrics that are better when lower.
    """

    min_improvement: dict[str, float] = field(default_factory=dict)
    max_regression: dict[str, float] = field(default_factory=dict)
    tie_tolerance: float = 0.0
    lower_is_better: frozenset[str] = LOWER_IS_BETTER

    def to_dict(self) -> dict[str, Any]:
        """As the decision carries them (register_model reads them back with :meth:`of`)."""
        return {
            "min_improvement": dict(self.min_improvement),
            "max_regression": dict(self.max_regression),
            "tie_tolerance": self.tie_tolerance,
            "lower_is_better": sorted(self.lower_is_better),
        }

    @classmethod
    def of(cls, data: dict[str, Any]) -> Rules:
        """The rules a decision carries (:meth:`to_dict`)."""
        return cls(
            min_improvement={str(k): float(v) for k, v in (data.get("min_improvement") or {}).items()},
            max_regression={str(k): float(v) for k, v in (data.get("max_regression") or {}).items()},
            tie_tolerance=float(data.get("tie_tolerance") or 0.0),
            lower_is_better=frozenset(data.get("lower_is_better") or LOWER_IS_BETTER),
        )

    def compared(self) -> list[str]:
        """The metrics the comparison looks at."""
        return sorted(set(self.min_improvement) | set(self.max_regression))


@dataclass
class Comparison:
    """What comparing a model with the holder found: every reason, the failed ones, and whether it is
    strictly better (every rule passed and one metric better by more than the tolerance)."""

    reasons: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    better: bool = False


def bad(value: Any) -> bool:
    """Missing, or NaN: such a metric fails closed."""
    return value is None or (isinstance(value, float) and math.isnan(value))


def improvement(name: str, a: float, b: float, lower: frozenset[str] = LOWER_IS_BETTER) -> float:
    """How much better ``a`` is than ``b`` (positive: better), in the metric's direction."""
    return (b - a) if name in lower else (a - b)


def compare(metrics: dict[str, Any], theirs: dict[str, Any], holder: str, rules: Rules) -> Comparison:
    """Compare a model's metrics with the holder's, on the same held-out rows.

    Args:
        metrics: The model's metrics.
        theirs: The holder's metrics.
        holder: How the reasons name the holder (``champion version 3``).
        rules: The comparison rules.

    Returns:
        Every reason, the failed ones, and whether the model is strictly better than the holder.
    """
    out = Comparison()
    tolerance = rules.tie_tolerance
    rows = [(n, "min_improvement", v) for n, v in sorted(rules.min_improvement.items())]
    rows += [(n, "max_regression", v) for n, v in sorted(rules.max_regression.items())]
    if not rows:
        out.reasons.append(
            f"{holder}: no comparison rules configured, so the model is not shown better: {holder} stays"
        )
        return out
    gained = False
    for name, kind, margin in rows:
        mine, other = metrics.get(name), theirs.get(name)
        if mine is None or other is None or bad(mine) or bad(other):
            reason = f"{name} vs {holder}: missing or NaN, fails closed"
            out.reasons.append(reason)
            out.failures.append(reason)
            continue
        delta = improvement(name, float(mine), float(other), rules.lower_is_better)
        gained = gained or delta > tolerance
        ok = delta >= margin if kind == "min_improvement" else delta >= -margin
        need = f"needs >= {margin:+.4f}" if kind == "min_improvement" else f"may regress by <= {margin:.4f}"
        word = "better" if delta > tolerance else "worse" if delta < -tolerance else "equal"
        reason = (
            f"{name} {float(mine):.4f} vs {holder} {float(other):.4f}: {word} by {abs(delta):.4f} ({need}): "
            f"{'ok' if ok else 'fails'}"
        )
        out.reasons.append(reason)
        if not ok:
            out.failures.append(reason)
    if not out.failures and not gained:
        within = f" (within tie_tolerance {tolerance:g})" if tolerance else ""
        out.reasons.append(
            f"a tie with {holder}: no compared metric ({', '.join(rules.compared())}) is better{within}; {holder} stays"
        )
    out.better = not out.failures and gained
    return out
