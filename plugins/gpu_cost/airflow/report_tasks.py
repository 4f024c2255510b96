"""Task bodies of ``gpu_weekly_cost_report``: KPIs → charts → files → Slack.

The report folder (a local folder or object storage) is what the tasks share: each writes its
part there and passes its location on, so XCom carries paths and a few figures, never data.

Where reports go is the deployment's choice (``GPU_COST_REPORT_DIR``, else the policy's
``report.out_dir``: the report root); a run's ``out_dir`` param only names a folder under it
(:func:`gpu_cost.airflow.runtime.under_root`). Every task works the location out again from the
run's params and refuses a path from XCom that lies outside it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpu_cost.airflow import runtime
from gpu_cost.core.connections import SLACK_CONN_ID
from gpu_cost.core.errors import GpuCostError
from gpu_cost.core.timeutil import epoch, iso

logger = logging.getLogger(__name__)


def location(params: Mapping[str, Any], policy: Any) -> str:
    """Return where the run's report goes: the report root, or the folder its ``out_dir`` param names under it.

    Raises :class:`~gpu_cost.airflow.runtime.RunParamError` for a path, a URL, ``..`` or a symlink
    out of the root.
    """
    from gpu_cost.report.render import out_location

    root = out_location(policy)
    name = params.get("out_dir")
    return root if not name else str(runtime.under_root(root, name, param="out_dir", nested=True))


def _inside(where: str, *paths: str) -> None:
    """Raise unless every path lies under the run's report location ``where`` (XCom may have been changed)."""
    import posixpath

    for path in paths:
        text = str(path)
        if "://" in where or "://" in text:
            ok = posixpath.normpath(text).startswith(posixpath.normpath(where).rstrip("/") + "/") and ".." not in text
        else:
            real, root = Path(text).resolve(), Path(where).resolve()
            ok = root in real.parents
        if not ok:
            raise GpuCostError(f"XCom names {text}, outside the run's report folder {where}: refused "
                               "(XCom was changed; the report is written only under the report root)")


def period(params: Mapping[str, Any], context: Mapping[str, Any]) -> dict[str, Any]:
    """Return the period to report: the ``since``/``until`` params, else the week before the run (policy time zone).

    A bad ``out_dir`` fails the run here, before anything is computed, with no retry.
    """
    from airflow.sdk.exceptions import AirflowFailException

    from gpu_cost.report.kpis import week_bounds

    run_id = runtime.audit_run_id(context)
    policy = runtime.pin_policy(runtime.store(), run_id, params)  # every later task of the run reads this one
    try:
        out = location(params, policy)
    except runtime.RunParamError as exc:  # a bad param does not fix itself in a retry delay
        raise AirflowFailException(str(exc)) from exc
    if params.get("since") or params.get("until"):
        if not (params.get("since") and params.get("until")):
            raise GpuCostError("give both since and until, or neither (the previous week)")
        since, until = epoch(params["since"]), epoch(params["until"])
    else:
        at = None
        for key in ("data_interval_end", "logical_date"):
            if context.get(key) is not None:
                at = epoch(context[key])
                break
        if at is None:
            dag_run = context.get("dag_run")
            at = epoch(dag_run.run_after)  # type: ignore[union-attr]
        since, until = week_bounds(at, policy.report.timezone, weeks_back=1)
    return {"since": iso(since), "until": iso(until), "run_id": run_id, "out": out}


def kpis(cfg: Mapping[str, Any], params: Mapping[str, Any], context: Mapping[str, Any]) -> dict[str, Any]:
    """Compute the KPIs and write ``kpis.json`` into the period's report folder; return its location."""
    from gpu_cost.report import kpis as kpis_mod
    from gpu_cost.report.render import report_folder

    store = runtime.store()
    policy = runtime.run_policy(store, runtime.audit_run_id(context))
    k = kpis_mod.compute(store, policy, epoch(cfg["since"]), epoch(cfg["until"]))
    folder = report_folder(location(params, policy), k)
    target = folder / "kpis.json"
    target.write_text(json.dumps(k, indent=1, default=str), encoding="utf-8")
    logger.info("KPIs for %s written to %s", k["period"]["label"], target)
    return {**cfg, "folder": str(folder), "kpis": str(target), "label": k["period"]["label"]}


def _kpis_of(ref: Mapping[str, Any]) -> dict[str, Any]:
    from gpu_cost.report.render import _root

    return dict(json.loads((_root(ref["kpis"])).read_text(encoding="utf-8")))


def _where(params: Mapping[str, Any], context: Mapping[str, Any]) -> str:
    return location(params, runtime.run_policy(runtime.store(), runtime.audit_run_id(context)))


def charts(ref: Mapping[str, Any], params: Mapping[str, Any], context: Mapping[str, Any]) -> dict[str, Any]:
    """Draw the charts from ``kpis.json`` into ``charts/``; return their locations."""
    from gpu_cost.report.charts import render_all
    from gpu_cost.report.render import _root

    _inside(_where(params, context), ref["folder"], ref["kpis"])
    k = _kpis_of(ref)
    out = {}
    for name, data in render_all(k).items():
        target = _root(ref["folder"]) / "charts" / f"{name}.png"
        target.write_bytes(data)
        out[name] = str(target)
    return {**ref, "charts": out}


def files(ref: Mapping[str, Any], params: Mapping[str, Any], context: Mapping[str, Any]) -> dict[str, Any]:
    """Write ``index.html`` (charts embedded) and ``summary.md``; return the report's path and headline."""
    from gpu_cost.report.render import _root, headline, write_report

    where = _where(params, context)
    _inside(where, ref["folder"], ref["kpis"], *ref["charts"].values())
    k = _kpis_of(ref)
    images = {name: _root(path).read_bytes() for name, path in ref["charts"].items()}
    written = write_report(k, images, where)
    return {"report": written["index"], "summary": written["summary"], "folder": written["folder"],
            "charts": written["charts"], "period": k["period"], "headline": headline(k)}


def slack(result: Mapping[str, Any], params: Mapping[str, Any], context: Mapping[str, Any]) -> dict[str, Any]:
    """Post the summary and the main chart to Slack (connection ``gpu_cost_slack``); skip cleanly without it."""
    from gpu_cost.report.delivery import post_report

    policy = runtime.run_policy(runtime.store(), runtime.audit_run_id(context))
    if not policy.report.slack or params.get("slack") is False:
        logger.info("Slack delivery is off (policy report.slack / param slack): report not posted")
        return {"posted": False, "why": "disabled"}
    _inside(location(params, policy), result["folder"], result["report"])
    return post_report(result, policy, SLACK_CONN_ID)
