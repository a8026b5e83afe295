"""tune_model's HTML report: the optimization history, the parameters' importances and, with several
objectives, the Pareto front (Optuna's Plotly figures, plotly.js inline so the page works offline),
and a table of every trial."""

from __future__ import annotations

import contextlib
import html
import json
import sys
from collections.abc import Iterator
from typing import Any

from trainpipe.components.tune_model.spec import TuneModelConfig, TuneModelResult

#: What Optuna's figures import and the report never uses: the matplotlib backend (``optuna.visualization``
#: imports it beside Plotly's) and fANOVA's random forest (``optuna.importance`` imports it; the importances
#: are PED-ANOVA's, Optuna's default). Optuna imports each as optional and goes on without it: about 1.5 s
#: of a study's end on two cores.
UNUSED_IMPORTS = ("matplotlib", "sklearn.ensemble")


@contextlib.contextmanager
def _without(modules: tuple[str, ...]) -> Iterator[None]:
    """While inside, importing one of ``modules`` (not yet imported) raises ImportError; after, it imports."""
    absent = [m for m in modules if m not in sys.modules]
    for m in absent:
        sys.modules[m] = None  # type: ignore[assignment]  # the import system's "not importable" mark
    try:
        yield
    finally:
        for m in absent:
            if sys.modules.get(m, "") is None:
                del sys.modules[m]


def _figures(study: Any, config: TuneModelConfig) -> list[tuple[str, Any]]:
    with _without(UNUSED_IMPORTS):
        return _plotly_figures(study, config)


def _plotly_figures(study: Any, config: TuneModelConfig) -> list[tuple[str, Any]]:
    import optuna.visualization as vis

    names = [o.metric for o in config.objectives]
    figs: list[tuple[str, Any]] = []
    for i, name in enumerate(names):
        target = (lambda t, i=i: t.values[i]) if len(names) > 1 else None
        figs.append(
            (f"Optimization history: {name}", vis.plot_optimization_history(study, target=target, target_name=name))
        )
        try:
            figs.append(
                (
                    f"Parameter importances for {name}",
                    vis.plot_param_importances(study, target=target, target_name=name),
                )
            )
        except (ValueError, RuntimeError) as exc:  # too few complete trials, or one parameter only
            figs.append((f"Parameter importances for {name}: not computed ({exc})", None))
    if len(names) > 1:
        figs.append(("Pareto front", vis.plot_pareto_front(study, target_names=names)))
    if len(names) == 1 and any(t.intermediate_values for t in study.get_trials(deepcopy=False)):
        figs.append(("Training curves (what the pruner compares)", vis.plot_intermediate_values(study)))
    return figs


def write_report(study: Any, config: TuneModelConfig, result: TuneModelResult) -> str:
    parts = []
    first = True
    for title, fig in _figures(study, config):
        parts.append(f"<h2>{html.escape(title)}</h2>")
        if fig is not None:
            parts.append(fig.to_html(full_html=False, include_plotlyjs="inline" if first else False))
            first = False
    rows = []
    for t in study.get_trials(deepcopy=False):
        values = ", ".join(f"{v:.4f}" for v in t.values) if t.values else ""
        rows.append(
            "<tr>"
            + "".join(
                f"<td>{html.escape(str(c))}</td>"
                for c in (
                    f"{t.number} (baseline)" if t.user_attrs.get("baseline") else t.number,
                    t.state.name.lower(),
                    values,
                    json.dumps(t.user_attrs.get("params") or t.params),
                    t.user_attrs.get("mlflow_run_id", ""),
                )
            )
            + "</tr>"
        )
    best = html.escape(json.dumps(result.best_params))
    if result.baseline_trial is None:
        taken = "its settings are the training's"
    elif result.adopted:
        taken = (
            f"it beats the baseline (trial {result.baseline_trial}, the train section as given): its settings are taken"
        )
    else:
        taken = f"it does not beat the baseline (trial {result.baseline_trial}): the train section as given is kept"
    spent = (
        f"<p id='spent'>The study's trials cost {result.cost:.4f} {html.escape(result.currency or '')} and held "
        f"{result.gpu_seconds:.0f} GPU-seconds.</p>"
        if result.cost is not None
        else f"<p id='spent'>The study's trials held {result.gpu_seconds:.0f} GPU-seconds.</p>"
    )
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>tune_model: study {html.escape(result.study_name)}</title>
<style>body{{font-family:sans-serif;margin:2em}} table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:3px 6px}}</style>
</head><body>
<h1>Study {html.escape(result.study_name)}</h1>
<p>{html.escape(result.summary())}</p>
<p>Best trial {result.best_trial}: {best}; {html.escape(taken)}</p>
{spent}
{"".join(parts)}
<h2>Trials</h2>
<table><tr><th>trial</th><th>state</th><th>{html.escape(", ".join(result.objectives))}</th>
<th>parameters</th><th>MLflow run</th></tr>
{"".join(rows)}
</table>
</body></html>
"""
