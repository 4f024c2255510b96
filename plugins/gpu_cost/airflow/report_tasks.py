"""Task bodies of ``gpu_weekly_cost_report``: KPIs → charts → files → Slack.

The report folder (a local folder or object storage) is what the tasks share: each writes its
part there and passes its location on, so XCom carries paths and a few figures, never data.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

from gpu_cost.airflow import runtime
from gpu_cost.connections import SLACK_CONN_ID
from gpu_cost.errors import GpuCostError
from gpu_cost.timeutil import epoch, iso

logger = logging.getLogger(__name__)


def period(params: Mapping[str, Any], context: Mapping[str, Any]) -> dict[str, Any]:
    """Return the period to report: the ``since``/``until`` params, else the week before the run (policy time zone)."""
    from gpu_cost.report.kpis import week_bounds

    run_id = runtime.audit_run_id(context)
    policy = runtime.pin_policy(runtime.store(), run_id, params)  # every later task of the run reads this one
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
    return {"since": iso(since), "until": iso(until), "run_id": run_id, "out": params.get("out_dir") or None}


def kpis(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Compute the KPIs and write ``kpis.json`` into the period's report folder; return its location."""
    from gpu_cost.report import kpis as kpis_mod
    from gpu_cost.report.render import out_location, report_folder

    store = runtime.store()
    policy = runtime.run_policy(store, cfg["run_id"])
    k = kpis_mod.compute(store, policy, epoch(cfg["since"]), epoch(cfg["until"]))
    folder = report_folder(out_location(policy, cfg.get("out")), k)
    target = folder / "kpis.json"
    target.write_text(json.dumps(k, indent=1, default=str), encoding="utf-8")
    logger.info("KPIs for %s written to %s", k["period"]["label"], target)
    return {**cfg, "folder": str(folder), "kpis": str(target), "label": k["period"]["label"]}


def _kpis_of(ref: Mapping[str, Any]) -> dict[str, Any]:
    from gpu_cost.report.render import _root

    return dict(json.loads((_root(ref["kpis"])).read_text(encoding="utf-8")))


def charts(ref: Mapping[str, Any]) -> dict[str, Any]:
    """Draw the charts from ``kpis.json`` into ``charts/``; return their locations."""
    from gpu_cost.report.charts import render_all
    from gpu_cost.report.render import _root

    k = _kpis_of(ref)
    out = {}
    for name, data in render_all(k).items():
        target = _root(ref["folder"]) / "charts" / f"{name}.png"
        target.write_bytes(data)
        out[name] = str(target)
    return {**ref, "charts": out}


def files(ref: Mapping[str, Any]) -> dict[str, Any]:
    """Write ``index.html`` (charts embedded) and ``summary.md``; return the report's path and headline."""
    from gpu_cost.report.render import _root, headline, write_report

    k = _kpis_of(ref)
    images = {name: _root(path).read_bytes() for name, path in ref["charts"].items()}
    written = write_report(k, images, ref["folder"].rsplit("/", 1)[0])
    return {"report": written["index"], "summary": written["summary"], "folder": written["folder"],
            "charts": written["charts"], "period": k["period"], "headline": headline(k)}


def slack(result: Mapping[str, Any], params: Mapping[str, Any], context: Mapping[str, Any]) -> dict[str, Any]:
    """Post the summary and the main chart to Slack (connection ``gpu_cost_slack``); skip cleanly without it."""
    from gpu_cost.report.delivery import post_report

    policy = runtime.run_policy(runtime.store(), runtime.audit_run_id(context))
    if not policy.report.slack or params.get("slack") is False:
        logger.info("Slack delivery is off (policy report.slack / param slack): report not posted")
        return {"posted": False, "why": "disabled"}
    return post_report(result, policy, SLACK_CONN_ID)
