"""Data drift between a reference table and a current one, per feature, with scipy.

The statistics and their defaults are the ones Evidently documents, so a team that knows
Evidently reads the same figures here:

- numeric column: two-sample Kolmogorov-Smirnov test when the reference has at most 1,000 rows
  (drift when p < 0.05), else the Wasserstein distance normed by the reference's standard
  deviation (drift when >= 0.1); ``psi`` (population stability index over the reference's
  deciles, drift when >= 0.1) on request;
- categorical column (strings, categories, booleans; ``categorical`` names more): chi-squared
  test of the two samples' counts when the reference has at most 1,000 rows (drift when
  p < 0.05; a category new in the current data counts), else the Jensen-Shannon distance
  between the two frequency distributions (drift when >= 0.1).

The data set drifted when at least ``drift_share`` of the compared columns drifted. Past
``sample_size`` rows a side is sampled without replacement with ``seed``: the figures of a
run are reproducible, and a million rows compare in seconds.

numpy, pandas and scipy are imported inside the functions.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from trainpipe.contract.errors import InputError

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

#: method -> (kind of column, what the figure is, default threshold)
METHODS: dict[str, tuple[str, str, float]] = {
    "ks": ("numeric", "p_value", 0.05),
    "wasserstein": ("numeric", "distance", 0.1),
    "psi": ("numeric", "distance", 0.1),
    "chisquare": ("categorical", "p_value", 0.05),
    "jensenshannon": ("categorical", "distance", 0.1),
}
#: Up to this many reference rows the tests (KS, chi-squared) decide; past it, the distances:
#: with many rows a test calls every negligible shift significant.
SMALL_SAMPLE = 1000
DEFAULT_SAMPLE_SIZE = 100_000


@dataclass(frozen=True)
class ColumnDrift:
    """One column's comparison. ``statistic`` is the p-value for a test (drift below the
    threshold) and the distance for a distance (drift at or above it)."""

    column: str
    kind: str
    method: str
    statistic: float
    threshold: float
    drifted: bool
    reference_rows: int
    current_rows: int
    is_label: bool = False


@dataclass
class DriftResult:
    columns: list[ColumnDrift]
    drift_share: float
    share_drifted: float
    dataset_drift: bool
    sample_size: int
    seed: int
    sampled: bool = False
    notes: list[str] = field(default_factory=list)

    @property
    def drifted_columns(self) -> list[str]:
        return [c.column for c in self.columns if c.drifted]

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["drifted_columns"] = self.drifted_columns
        return out


def _kind(series: pd.Series, categorical: set[str]) -> str:
    import pandas as pd

    if series.name in categorical:
        return "categorical"
    if pd.api.types.is_bool_dtype(series) or not pd.api.types.is_numeric_dtype(series):
        return "categorical"
    return "numeric"


def sample(df: pd.DataFrame, size: int, seed: int) -> pd.DataFrame:
    """At most ``size`` rows of ``df``, drawn without replacement with ``seed`` (all of it when smaller)."""
    if len(df) <= size:
        return df
    return df.sample(n=size, random_state=seed, replace=False)


def _numeric(method: str, ref: Any, cur: Any) -> float:
    import numpy as np
    from scipy import stats

    if method == "ks":
        return float(stats.ks_2samp(ref, cur).pvalue)
    if method == "wasserstein":
        return float(stats.wasserstein_distance(ref, cur) / max(float(np.std(ref)), 0.001))
    # psi over the reference's deciles; an empty bin counts as 0.01 % so the logarithm is finite
    edges = np.unique(np.quantile(ref, np.linspace(0, 1, 11)))
    if len(edges) < 2:
        edges = np.array([edges[0] - 0.5, edges[0] + 0.5])
    edges[0], edges[-1] = -np.inf, np.inf
    p = np.clip(np.histogram(ref, edges)[0] / len(ref), 1e-4, None)
    q = np.clip(np.histogram(cur, edges)[0] / len(cur), 1e-4, None)
    return float(np.sum((q - p) * np.log(q / p)))


def _categorical(method: str, ref: pd.Series, cur: pd.Series) -> float:
    import numpy as np
    from scipy import stats
    from scipy.spatial.distance import jensenshannon

    r, c = ref.astype(str).value_counts(), cur.astype(str).value_counts()
    keys = sorted(set(r.index) | set(c.index))
    counts = np.array([[r.get(k, 0) for k in keys], [c.get(k, 0) for k in keys]], dtype=float)
    if method == "chisquare":
        if len(keys) < 2:
            return 1.0  # one value on both sides: nothing moved
        return float(stats.chi2_contingency(counts).pvalue)
    return float(jensenshannon(counts[0] / counts[0].sum(), counts[1] / counts[1].sum()))


def compare(
    reference: pd.DataFrame,
    current: pd.DataFrame,
    *,
    columns: list[str] | None = None,
    categorical: list[str] | tuple[str, ...] = (),
    label: str | None = None,
    drift_share: float = 0.5,
    methods: dict[str, str] | None = None,
    thresholds: dict[str, float] | None = None,
    sample_size: int = DEFAULT_SAMPLE_SIZE,
    seed: int = 0,
) -> DriftResult:
    """Compare each column of ``current`` with ``reference``; see the module's text.

    ``columns`` defaults to the reference's; ``label`` is compared too and marked as the label
    (it counts towards the share like any column). ``methods`` and ``thresholds`` override the
    defaults per column. Raises :class:`InputError` (one line, naming the column) on schemas that
    differ, an empty side, or an unknown method.
    """
    methods, thresholds = dict(methods or {}), dict(thresholds or {})
    if not 0 < drift_share <= 1:
        raise InputError(f"drift_share: {drift_share} is not in (0, 1]")
    if sample_size < 2:
        raise InputError(f"sample_size: {sample_size} is fewer than 2 rows")
    for name, df in (("reference", reference), ("current", current)):
        if len(df) == 0:
            raise InputError(f"{name}: has no rows to compare")
    names = list(columns) if columns is not None else [c for c in reference.columns if c != label]
    if label is not None:
        names.append(label)
    for col in names:
        for name, df in (("reference", reference), ("current", current)):
            if col not in df.columns:
                raise InputError(f"{name}: has no column {col!r} (the schemas differ)")
    extra = [c for c in current.columns if c not in reference.columns]
    if extra and columns is None:
        raise InputError(f"current: column {extra[0]!r} is not in the reference (the schemas differ)")
    cat = set(categorical) | ({label} if label is not None and _label_is_categorical(reference[label]) else set())
    for col, method in methods.items():
        if method not in METHODS:
            raise InputError(f"methods.{col}: {method!r} is not one of {', '.join(METHODS)}")
    sampled = len(reference) > sample_size or len(current) > sample_size
    ref, cur = sample(reference[names], sample_size, seed), sample(current[names], sample_size, seed + 1)
    out = []
    for col in names:
        kind = _kind(reference[col], cat)
        if _kind(current[col], cat) != kind:
            raise InputError(
                f"current: column {col!r} is {_kind(current[col], cat)} but {kind} in the reference (the schemas "
                "differ)"
            )
        r, c = ref[col].dropna(), cur[col].dropna()
        if len(r) == 0 or len(c) == 0:
            raise InputError(f"{'reference' if len(r) == 0 else 'current'}: column {col!r} has no values")
        method = methods.get(col) or _default_method(kind, len(r))
        if METHODS[method][0] != kind:
            raise InputError(f"methods.{col}: {method} compares {METHODS[method][0]} columns; {col!r} is {kind}")
        figure, default = METHODS[method][1], METHODS[method][2]
        threshold = float(thresholds.get(col, default))
        value = (
            _numeric(method, r.to_numpy(dtype=float), c.to_numpy(dtype=float))
            if kind == "numeric"
            else _categorical(method, r, c)
        )
        drifted = value < threshold if figure == "p_value" else value >= threshold
        out.append(ColumnDrift(col, kind, method, value, threshold, bool(drifted), len(r), len(c), col == label))
    share = sum(c.drifted for c in out) / len(out)
    return DriftResult(out, drift_share, share, share >= drift_share, sample_size, seed, sampled)


def _default_method(kind: str, rows: int) -> str:
    if kind == "numeric":
        return "ks" if rows <= SMALL_SAMPLE else "wasserstein"
    return "chisquare" if rows <= SMALL_SAMPLE else "jensenshannon"


def _label_is_categorical(series: pd.Series) -> bool:
    """A classification label: not numeric, or integers with few distinct values."""
    import pandas as pd

    if not pd.api.types.is_numeric_dtype(series) or pd.api.types.is_bool_dtype(series):
        return True
    return pd.api.types.is_integer_dtype(series) and series.nunique() <= 50
