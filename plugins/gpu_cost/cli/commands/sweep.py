"""``gpu-cost sweep``: one sweep outside Airflow (collect → detect → decide → record)."""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import Mapping, Sequence
from typing import Any

from gpu_cost.cli.options import add_db, add_json, add_policy, instant_arg, open_store
from gpu_cost.core.errors import GpuCostError


def register(sub: Any) -> None:
    p = sub.add_parser("sweep", help="run one sweep now, outside Airflow",
                       description="Collect, detect, decide and record once. Every finding that leads to no action "
                                   "is listed with the reason (dry-run, protected, snoozed, waiting on the ladder, "
                                   "cap, degraded data).")
    p.add_argument("--source", choices=["sim", "prometheus"], help="data source (default: the policy's)")
    p.add_argument("--mode", choices=["dry-run", "notify", "enforce"], help="override the policy's mode")
    add_policy(p)
    p.add_argument("--scenario", help="simulator scenario file (source sim)")
    p.add_argument("--at", help="instant to look at (ISO 8601 or epoch; default: now)")
    add_db(p)
    add_json(p)
    p.set_defaults(handler=_sweep)


def require_prometheus(source: str, flag: str = "--source prometheus") -> None:
    """Raise a one-line GpuCostError when ``source`` is prometheus and no Prometheus server is configured.

    Without it the sweep would run, find every source failing and record a degraded run: a person who
    forgot the URL deserves to be told so, not to read a degraded summary.
    """
    if source != "prometheus":
        return
    from gpu_cost.core import connections
    from gpu_cost.core.errors import SourceError
    from gpu_cost.perceive import prometheus

    try:
        prometheus.prometheus_config()
    except SourceError as exc:
        if connections.lookup(prometheus.CONN_ID, SourceError) is None and not __import__("os").environ.get(
                prometheus.URL_ENV):
            raise GpuCostError(f"{flag}: no Prometheus URL configured (set {prometheus.URL_ENV} or the Airflow "
                               f"connection {prometheus.CONN_ID}, e.g. "
                               f"{connections.env_var(prometheus.CONN_ID)}=http://prometheus:9090)") from None
        raise GpuCostError(f"{flag}: {exc}") from None


def _sweep(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    from gpu_cost.config.loader import load_policy
    from gpu_cost.core.timeutil import iso
    from gpu_cost.loop.sweep import run_once

    policy = load_policy(args.policy)
    if args.mode:
        policy = _with_mode(policy, args.mode)
    source = args.source or policy.sweep.source
    require_prometheus(source, "--source prometheus" if args.source else f"{policy.source}: sweep.source prometheus")
    now = instant_arg(args.at, "--at") if args.at else time.time()
    now = float(now // policy.sweep.sample_interval * policy.sweep.sample_interval)
    store = open_store(args, writes=True)
    kwargs: dict[str, Any] = {}
    if args.scenario:
        kwargs["scenario"] = args.scenario
    out = run_once(policy, now, store, source=args.source, **kwargs)
    out["audit_db"] = store.path or store.url.split("@")[-1]
    snoozed = {(r["rule"], r["target"]): r for r in out.get("snoozed", [])}
    out["no_action"] = no_action(out["findings"], out["decisions"], out["waiting"], out["cap_violation"], snoozed)
    rules = _enabled_rules(policy)
    out["looked_at"] = {"gpus": out["gpus"], "jobs": out["jobs"], "rules": rules}
    lines = [f"sweep at {iso(now)} on {out['source']} ({out['gpus']} GPUs, {out['jobs']} running jobs), mode {out['mode']}"]
    if out["problems"]:
        lines.append(("degraded: " if out["degraded"] else "problems: ") + "; ".join(out["problems"]))
    if not out["findings"]:
        lines.append(f"no findings: looked at {out['gpus']} GPUs and {out['jobs']} running jobs with the rules "
                     f"{', '.join(rules) or '(none enabled)'}; nothing crossed a rule's threshold"
                     + (" (the data was degraded: see above)" if out["degraded"] else ""))
    else:
        lines.append(f"{len(out['findings'])} finding(s), {len(out['decisions'])} decision(s):")
        for d in out["decisions"]:
            lines.append(f"  {d['rule']:<16} {d['target']:<34} → {d['action']:<14} [{d['mode']}] {d['reason']}")
        if out["no_action"]:
            lines.append(f"no action on {len(out['no_action'])} of {len(out['findings'])} finding(s):")
            for n in out["no_action"]:
                lines.append(f"  {n['rule']:<16} {n['target']:<34} {n['outcome']}: {n['why']}")
    return out, "\n".join(lines)


def no_action(findings: Sequence[Mapping[str, Any]], decisions: Sequence[Mapping[str, Any]],
              waiting: Sequence[Mapping[str, Any]], cap_violation: str | None,
              snoozed: Mapping[tuple[str, str], Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Return, for each finding that leads to no action, what held it back and why.

    ``outcome`` is one of ``dry-run``, ``notify``, ``degraded``, ``protected``, ``capped``,
    ``snoozed``, ``waiting``, ``unknown``; a finding whose decision acts is not listed.
    """
    from gpu_cost.core.timeutil import format_duration

    by_key = {(d["rule"], d["target"]): d for d in decisions}
    waits = {(w["rule"], w["target"]): w for w in waiting}
    out: list[dict[str, Any]] = []
    for f in findings:
        key = (f["rule"], f["target"])
        d, w = by_key.get(key), waits.get(key)
        reason = str(d["reason"]) if d else ""
        if d is not None and d["action"] == "none":
            outcome, why = ("protected" if "protected" in reason else "unknown"), reason
        elif d is not None and d["mode"] == "dry-run":
            if "degraded data" in reason:
                outcome, why = "degraded", reason[reason.index("degraded data"):]
            elif "mode notify" in reason:
                outcome, why = "notify", f"mode notify holds back {d['action']} (recorded only)"
            else:
                outcome, why = "dry-run", f"would {d['action']} (mode dry-run: recorded only)"
        elif d is not None and cap_violation:
            outcome, why = "capped", f"would {d['action']}, but the run is capped: {cap_violation}"
        elif d is not None:
            continue
        elif w is not None:
            outcome = "waiting"
            if w.get("why"):
                why = str(w["why"])
            elif w.get("due_in_s") is not None:
                why = f"next step {w.get('action')} due in {format_duration(float(w['due_in_s']))} (escalation ladder)"
            else:
                why = "waiting on the escalation ladder"
        elif key in snoozed:
            outcome, why = "snoozed", str(snoozed[key].get("reason") or "snoozed")
        else:
            outcome, why = "unknown", "the engine recorded no decision and no reason"
        out.append({"rule": f["rule"], "target": f["target"], "job_id": f.get("job_id"), "user": f.get("user"),
                    "outcome": outcome, "why": why})
    return out


def _enabled_rules(policy: Any) -> list[str]:
    from gpu_cost.core import registry

    return [n for n in registry.rules() if policy.rule(n).enabled]


def _with_mode(policy: Any, mode: str) -> Any:
    new = dataclasses.replace(policy, mode=mode)
    object.__setattr__(new, "source", policy.source)
    return new
