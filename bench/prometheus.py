"""Benchmark: the whole sweep on a real Prometheus at scale, with and without the recording rules.

``make bench``'s ``bench.queries`` shows that a sweep's query count is constant; this one shows what
the queries cost Prometheus once the cluster is large. It builds a real Prometheus TSDB for a
generated cluster of ``--gpus`` GPUs (8 per node) with 6 h 10 min of 1-minute samples in
dcgm-exporter's format (``gpu_cost.sim.exporter.openmetrics_history``, the simulator's
series; written in 2-hour slices and loaded with ``promtool tsdb create-blocks-from
openmetrics``), adds the shipped recording rules' output for that range (``promtool tsdb
create-blocks-from rules`` against the loaded server, as ``tests/fixtures/prometheus.py``'s
``TsdbProm`` does for the tests), and serves it on a loopback port.

Then it times whole sweeps, alternately reading raw series and the recorded ones
(``PromConfig.recording_rules``): the freshness sensor and the live snapshot (``live.check_fresh``,
``live.snapshot``: its PromQL, and ``squeue --json`` text of ``--jobs`` jobs generated for the
same cluster, parsed by the real parser ``sources.slurm.parse_jobs``), then the rules and the
decision engine. Each query the sweep sent is then asked again with ``stats=all`` for
Prometheus's own figures: ``samples`` (``totalQueryableSamples``), ``peak_samples`` and
``prom_exec_s`` (``execTotalTime``). ``sweep_s`` is the fastest of ``--repeat`` sweeps of a mode.

With ``--decoders N``, each answer of the fastest sweep of each mode is also asked again and decoded
both ways the source can (``decoders``): as ``prometheus_api_client.PrometheusConnect`` does
(requests' ``response.json()``, then the source's shape check, ``msgspec.convert``) and as the source
does for its large answers (``msgspec``, decoded and checked in one pass), the median of N each, per
query: what ``perceive.prometheus.LARGE_ANSWERS`` rests on.

    python -m bench.prometheus [--gpus 10000] [--jobs 20000] [--repeat 2] [--modes raw,rules] [--json] [--keep DIR]
                               [--decoders 3]

The full size (10,000 GPUs: 22 M samples, ~6 GB of OpenMetrics written and loaded a 2-hour slice
at a time) takes about 17 minutes to build on two cores, and a raw sweep of it several minutes
(``--modes rules`` skips it); ``make bench`` runs ``--gpus 1000``.
Everything lives in one temporary directory, removed at the end, unless ``--keep DIR`` names a
folder to build it in and keep (a later run with the same folder reuses the TSDB: its rules'
output is what the shipped rules were when it was built).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import itertools
import json
import logging
import math
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench._common import report

ROOT = Path(__file__).resolve().parents[1]
HISTORY = 6 * 3600 + 600  # the lookback, the quiet sample before it and a margin for the rules' start
BLOCK = 7200  # promtool's block length: slices on its boundaries make blocks that do not overlap
SQUEUE_TEMPLATE = ROOT / "tests" / "data" / "slurm" / "squeue-22.05.json"


def _uptime() -> str:
    with contextlib.suppress(OSError):
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    return "?"


# ---------------------------------------------------------------------------------------------
# the cluster: Prometheus history and Slurm's answer


def cluster(gpus: int, jobs: int, anchor: float) -> Any:
    """Return the simulated cluster: ``gpus`` GPUs, two running jobs per node, pending jobs up to ``jobs``."""
    from gpu_cost.sim.cluster import SimCluster, generate_scenario

    nodes = max(1, math.ceil(gpus / 8))
    sc = generate_scenario(nodes=nodes, gpus_per_node=8, jobs_per_node=2, pending=max(0, jobs - 2 * nodes), seed=5,
                           anchor=anchor)
    return SimCluster(sc, anchor=anchor)


def load_history(sim: Any, prom: Any, anchor: float) -> int:
    """Write the cluster's history into the TSDB, one promtool block slice at a time; return the samples."""
    from gpu_cost.sim.exporter import openmetrics_history

    start = anchor - HISTORY
    edges = [start, *[b for b in range(int(start // BLOCK + 1) * BLOCK, int(anchor), BLOCK)], anchor]
    samples = 0
    om = prom.root / "slice.om"
    for lo, hi in itertools.pairwise(edges):
        with om.open("w", encoding="utf-8") as fh:
            for line in openmetrics_history(sim, lo, hi, {"job": "dcgm", "instance": "dcgm:9400"}):
                fh.write(line + "\n")
                samples += not line.startswith("#")
        prom.add_openmetrics(om)
        om.unlink()
    return samples


def squeue_text(jobs: Sequence[Any]) -> str:
    """Return ``squeue --json`` (Slurm 22.05) text for the jobs, each shaped like a captured record."""
    from gpu_cost.perceive.slurm import compress_hostlist

    doc = json.loads(SQUEUE_TEMPLATE.read_text())
    template = next(j for j in doc["jobs"] if j["job_state"] == "RUNNING")
    out = []
    for job in jobs:
        d = copy.deepcopy(template)
        gpus = sum(len(idx) for _, idx in job.gpu_alloc) or job.gpus_requested or 1
        tres = f"cpu={gpus * 4},mem={gpus * 64}G,node={max(1, len(job.nodes))},billing={gpus * 4},gres/gpu={gpus}"
        d.update({
            "job_id": int(job.job_id), "user_name": job.user, "account": job.account or "research",
            "partition": job.partition or "batch", "name": job.name or f"job-{job.job_id}", "comment": job.comment,
            "job_state": job.state, "submit_time": int(job.submit_ts or (job.start_ts or 0) - 60),
            "start_time": int(job.start_ts or 0), "end_time": int((job.start_ts or 0) + (job.time_limit_s or 86400)),
            "time_limit": int((job.time_limit_s or 86400) / 60), "priority": 1000, "nice": 0,
            "tres_req_str": tres, "tres_alloc_str": tres if job.running else "",
            "tres_per_node": f"gres:gpu:a100:{gpus}",
        })
        if job.running:
            d["nodes"] = compress_hostlist(job.nodes)
            d["gres_detail"] = [f"gpu:a100:{len(idx)}(IDX:{','.join(str(i) for i in idx)})" for _, idx in job.gpu_alloc]
            d["job_resources"] = {**template["job_resources"], "nodes": d["nodes"], "allocated_hosts": len(job.nodes),
                                  "allocated_nodes": [{**template["job_resources"]["allocated_nodes"][0], "nodename": h}
                                                      for h in job.nodes]}
        else:
            d.update({"nodes": "", "gres_detail": [], "job_resources": {}, "start_time": 0, "end_time": 0})
        out.append(d)
    doc["jobs"] = out
    return json.dumps(doc)


class GeneratedSlurm:
    """Slurm as the snapshot reads it: jobs parsed from ``squeue --json`` text by the real parser."""

    def __init__(self, text: str, nodes: Sequence[Any]) -> None:
        self.text, self.node_list = text, list(nodes)
        self.parse_s = 0.0

    def jobs(self) -> list[Any]:
        from gpu_cost.perceive.slurm import load_json, parse_jobs

        t0 = time.perf_counter()
        jobs = [j for j in parse_jobs(load_json(self.text, "squeue --json")) if j.running or j.pending]
        self.parse_s = time.perf_counter() - t0
        return jobs

    def nodes(self) -> list[Any]:
        return self.node_list

    def reservations(self) -> list[Any]:
        return []


# ---------------------------------------------------------------------------------------------
# one sweep


def sweep(prom: Any, slurm: GeneratedSlurm, now: float, rules: bool) -> dict[str, Any]:
    """Run one sweep (sensor, snapshot, rules, decisions); return its times and the queries it sent."""
    from gpu_cost.analyse.rules import run_rules
    from gpu_cost.config.loader import load_policy
    from gpu_cost.decide.engine import decide
    from gpu_cost.perceive import live
    from gpu_cost.perceive.prometheus import PromConfig, PrometheusSource

    policy = load_policy()
    source = PrometheusSource(PromConfig(url=prom.url, timeout=600, recording_rules=rules))
    sent: list[tuple[str, Any, str, float]] = []
    real_query, real_range = source.query, source.query_range

    def timed(promql: str, at: float, what: str, keyed: bool = False) -> Any:
        q0 = time.perf_counter()
        try:
            return real_query(promql, at, what, keyed)
        finally:
            sent.append((promql, at, what, time.perf_counter() - q0))

    def timed_range(promql: str, span: tuple[str, str, str], what: str) -> Any:
        q0 = time.perf_counter()
        try:
            return real_range(promql, span, what)
        finally:
            sent.append((promql, span, what, time.perf_counter() - q0))

    source.query = timed  # type: ignore[method-assign]
    source.query_range = timed_range  # type: ignore[method-assign]
    t0 = time.perf_counter()
    fresh, why = live.check_fresh(policy, now, prometheus=source)
    snap = live.snapshot(policy, now, prometheus=source, slurm=slurm, processes=False)
    t1 = time.perf_counter()
    findings = run_rules(snap, policy)
    plan = decide(findings, policy, now=now, escalations={}, total_gpus=len(snap.gpus))
    t2 = time.perf_counter()
    return {"sweep_s": t2 - t0, "snapshot_s": t1 - t0, "promql_s": sum(q[3] for q in sent), "parse_s": slurm.parse_s,
            "decide_s": t2 - t1, "queries": len(sent), "rules_used": source.rules_used or "raw", "fresh": fresh,
            "why": why, "gpus_seen": len(snap.gpus), "stale": int(snap.gpus["stale"].sum()) if len(snap.gpus) else 0,
            "jobs_seen": len(snap.jobs), "findings": len(findings), "decisions": len(plan.decisions),
            "problems": "; ".join(snap.problems)[:200] or "-", "sent": sent, "frame": snap.gpus}


def prom_stats(prom: Any, sent: Sequence[tuple[str, Any, str, float]]) -> dict[str, Any]:
    """Ask each query again with ``stats=all``: Prometheus's samples and its own time."""
    import urllib.parse
    import urllib.request

    samples = peak = 0
    exec_s = 0.0
    per: dict[str, int] = {}
    for promql, at, what, _ in sent:
        if isinstance(at, tuple):  # a range query: (start, end, step)
            form = {"query": promql, "start": at[0], "end": at[1], "step": at[2], "stats": "all"}
            with urllib.request.urlopen(f"{prom.url}/api/v1/query_range", data=urllib.parse.urlencode(form).encode(),
                                        timeout=300) as r:
                data = json.loads(r.read())["data"]
            what = "chunks"
        else:
            data = prom.query(promql, at, stats=True)
        st = data.get("stats", {})
        n = int(st.get("samples", {}).get("totalQueryableSamples", 0))
        samples += n
        per[what] = per.get(what, 0) + n
        peak = max(peak, int(st.get("samples", {}).get("peakSamples", 0)))
        exec_s += float(st.get("timings", {}).get("execTotalTime", 0.0))
    return {"samples": samples, "peak_samples": peak, "prom_exec_s": exec_s, "samples_by_query": per}


def decoders(prom: Any, sent: Sequence[tuple[str, Any, str, float]], repeat: int) -> list[dict[str, Any]]:
    """Per query kind of a sweep (the chunk reads together): the answers' size and the median seconds of
    ``repeat`` decodings each way, PrometheusConnect's (``json`` into dicts, then checked) and msgspec's,
    and of ``repeat`` whole queries each way (Prometheus's evaluation included)."""
    import datetime
    import statistics

    import msgspec
    import requests

    from gpu_cost.perceive import prometheus as pm

    source = pm.PrometheusSource(pm.PromConfig(url=prom.url, timeout=600))
    conn = source.client
    kinds: dict[str, dict[str, Any]] = {}
    for promql, at, what, _ in sent:
        ranged = isinstance(at, tuple)
        kind = "chunks" if ranged else what
        keyed = not ranged and what in pm.LARGE_ANSWERS and what != "current"
        form = ({"query": promql, "start": at[0], "end": at[1], "step": at[2]} if ranged
                else {"query": promql, "time": f"{at:.3f}"})
        body = conn.post("/api/v1/query_range" if ranged else "/api/v1/query", form, 600)
        decoder, typ = ((pm._RANGE, pm.RangeSample) if ranged else (pm._KEYED, pm.KeyedSample) if keyed
                        else (pm._ANSWER, pm.Sample))

        def by_library(body: bytes = body, typ: Any = typ) -> Any:
            # what custom_query does with a 200 answer (requests' response.json()), then the source's check
            return msgspec.convert(requests.models.complexjson.loads(body.decode("utf-8"))["data"]["result"], list[typ])

        def by_msgspec(body: bytes = body, decoder: Any = decoder) -> Any:
            return decoder.decode(body).data.result

        def ask_library(promql: str = promql, at: Any = at, typ: Any = typ, ranged: bool = ranged) -> Any:
            if ranged:
                start, end = (datetime.datetime.fromtimestamp(float(t), tz=datetime.UTC) for t in at[:2])
                # start and end as sent: custom_query_range rounds them to whole seconds, and the chunk
                # reads (a 1 ms window at the rules' evaluation times) would then answer nothing
                got = conn.api.custom_query_range(promql, start, end, at[2], params={"start": at[0], "end": at[1]},
                                                  timeout=600)
            else:
                got = conn.api.custom_query(promql, params={"time": f"{at:.3f}"}, timeout=600)
            return msgspec.convert(got, list[typ])

        def ask_msgspec(form: dict[str, Any] = form, ranged: bool = ranged, decoder: Any = decoder) -> Any:
            return decoder.decode(conn.post("/api/v1/query_range" if ranged else "/api/v1/query", form, 600)).data.result

        row = kinds.setdefault(kind, {"query": kind, "answer_mb": 0.0, "series": 0, "library_decode_s": 0.0,
                                      "msgspec_decode_s": 0.0, "library_query_s": 0.0, "msgspec_query_s": 0.0})
        row["answer_mb"] += len(body) / 1e6
        row["series"] += len(by_msgspec())
        pairs = ((("library_decode_s", by_library), ("msgspec_decode_s", by_msgspec)),
                 (("library_query_s", ask_library), ("msgspec_query_s", ask_msgspec)))
        for pair in pairs:
            times: dict[str, list[float]] = {key: [] for key, _ in pair}
            for i in range(max(1, repeat)):
                for key, fn in pair if i % 2 == 0 else pair[::-1]:  # in turn: neither way always first
                    t0 = time.perf_counter()
                    fn()
                    times[key].append(time.perf_counter() - t0)
            for key, got in times.items():
                row[key] += statistics.median(got)
    out = []
    for row in kinds.values():
        row["answer_mb"] = round(row["answer_mb"], 3)
        row["decode_ratio"] = round(row["library_decode_s"] / max(row["msgspec_decode_s"], 1e-9), 1)
        for key in ("library_decode_s", "msgspec_decode_s", "library_query_s", "msgspec_query_s"):
            row[key.replace("_s", "_ms")] = round(1000 * row.pop(key), 2)
        row["path"] = "msgspec" if row["query"] in pm.LARGE_ANSWERS or row["query"] == "chunks" else "PrometheusConnect"
        out.append(row)
    return out


def _by_kind(sent: Sequence[tuple[str, Any, str, float]]) -> dict[str, float]:
    """Seconds per query (the chunk reads, sent at once, as their longest)."""
    out: dict[str, float] = {}
    for _, at, what, seconds in sent:
        kind = "chunks" if isinstance(at, tuple) else what
        out[kind] = round(max(out.get(kind, 0.0), seconds), 3)
    return out


def blocks(prom: Any) -> int:
    return sum(1 for d in prom.data.iterdir() if (d / "meta.json").is_file())


def wait_compacted(prom: Any, settle: float = 75.0, timeout: float = 1800.0) -> int:
    """Wait until Prometheus has merged the backfilled blocks that overlap (a minute's cycle with no change)."""
    deadline = time.monotonic() + timeout
    last, since = blocks(prom), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(5)
        now_blocks = blocks(prom)
        if now_blocks != last:
            last, since = now_blocks, time.monotonic()
        elif time.monotonic() - since >= settle:
            break
    return last


def rules_cost(prom: Any, at: float) -> dict[str, Any]:
    """Samples one evaluation of the shipped rules reads (each asked as an instant query at their evaluation time)."""
    import yaml

    from gpu_cost.perceive import recording

    doc = yaml.safe_load((ROOT / recording.SHIPPED).read_text())
    samples, exec_s = 0, 0.0
    for group in doc["groups"]:
        for rule in group["rules"]:
            st = prom.query(rule["expr"], at, stats=True).get("stats", {})
            samples += int(st.get("samples", {}).get("totalQueryableSamples", 0))
            exec_s += float(st.get("timings", {}).get("execTotalTime", 0.0))
    return {"rules_samples_per_eval": samples, "rules_exec_s_per_eval": exec_s}


def _rules_at(prom: Any, now: float) -> float:
    """The rules' last evaluation time at ``now`` (their info series' timestamp)."""
    from gpu_cost.perceive import recording

    result = prom.query(f"timestamp({recording.INFO})", now).get("result", [])
    return float(result[0]["value"][1]) if result else now


def same_answers(a: Any, b: Any) -> bool:
    """True when two snapshots' GPU frames agree (as the integration test holds them)."""
    import numpy as np

    if list(a.columns) != list(b.columns) or len(a) != len(b):
        return False
    for col in a.columns:
        x, y = a[col].to_numpy(), b[col].to_numpy()
        if x.dtype.kind == "f":
            if not np.allclose(x, y, rtol=1e-9, atol=1e-6, equal_nan=True):
                return False
        elif x.tolist() != y.tolist():
            return False
    return True


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--gpus", type=int, default=10000, help="GPUs in the cluster (8 per node)")
    ap.add_argument("--jobs", type=int, default=20000, help="jobs in squeue (two running per node, the rest pending)")
    ap.add_argument("--repeat", type=int, default=2, help="sweeps per mode (the fastest is reported)")
    ap.add_argument("--modes", default="raw,rules", help="raw (raw series), rules (recording rules) or both")
    ap.add_argument("--decoders", type=int, default=0, metavar="N",
                    help="decode each answer of the fastest sweeps both ways (PrometheusConnect's json, msgspec), "
                         "N times each (0: not)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    ap.add_argument("--keep", type=Path, default=None, metavar="DIR",
                    help="build the TSDB in DIR and keep it; a later run with the same DIR and --gpus reuses it "
                         "(the build takes most of a 10,000-GPU run)")
    args = ap.parse_args(argv)
    missing = [b for b in ("prometheus", "promtool") if not shutil.which(b)]
    if missing:
        raise SystemExit(f"bench.prometheus needs {', '.join(missing)} (scripts/install-system-deps.sh installs them)")
    sys.path.insert(0, str(ROOT))
    from tests.fixtures.prometheus import TsdbProm  # the tests' recipe: backfilled TSDB, rules, restarts

    from gpu_cost.perceive import recording

    logging.getLogger("gpu_cost").setLevel(logging.WARNING)
    tmp = args.keep.resolve() if args.keep else Path(tempfile.mkdtemp(prefix="gpu-cost-bench-prometheus-"))
    built = tmp / "built.json"  # written once the TSDB is whole: what a kept one holds
    kept = json.loads(built.read_text()) if args.keep and built.is_file() else None
    if kept and kept["gpus"] != args.gpus:
        raise SystemExit(f"{tmp} holds a TSDB of {kept['gpus']} GPUs, not {args.gpus}: pick another --keep folder")
    if args.keep and not kept and tmp.exists() and any(tmp.iterdir()):
        raise SystemExit(f"{tmp} is not empty and holds no finished TSDB: remove it or pick another --keep folder")
    anchor = float(kept["anchor"]) if kept else float(math.floor(time.time() / 60) * 60)
    tmp.mkdir(parents=True, exist_ok=True)
    prom = TsdbProm(tmp)
    try:
        t0 = time.perf_counter()
        sim = cluster(args.gpus, args.jobs, anchor)
        if kept:
            samples = int(kept["samples"])
            t1 = t2 = time.perf_counter()
            prom.start()
            before = after = blocks(prom)
        else:
            samples = load_history(sim, prom, anchor)
            t1 = time.perf_counter()
            prom.start()
            # a minute past the end: the rules' evaluation after the last grid step, which a sweep reads
            prom.backfill_rules(ROOT / recording.SHIPPED, anchor - HISTORY + 300, anchor + 60)
            t2 = time.perf_counter()
            before = blocks(prom)
            after = wait_compacted(prom)
            if args.keep:
                built.write_text(json.dumps({"gpus": args.gpus, "anchor": anchor, "samples": samples}))
        t3 = time.perf_counter()
        tsdb_mb = sum(f.stat().st_size for f in prom.data.rglob("*") if f.is_file()) / 1e6
        now = anchor + 59.999  # the raw grid ends at the anchor; the rules' evaluation after it is within the minute
        jobs = sim.jobs_at(now)
        slurm = GeneratedSlurm(squeue_text(jobs), sim.nodes_at(now))
        modes = [m == "rules" for m in ("raw", "rules") if m in args.modes.split(",")]
        runs: dict[bool, list[dict[str, Any]]] = {m: [] for m in modes}
        for _ in range(max(1, args.repeat)):
            for rules in modes:
                runs[rules].append(sweep(prom, slurm, now, rules))
        rows = []
        for rules in modes:
            best = min(runs[rules], key=lambda r: float(r["sweep_s"]))
            stats = prom_stats(prom, best["sent"])
            rows.append({"mode": "recording rules" if rules else "raw series", "gpus": args.gpus,
                         "jobs": len(jobs), "squeue_mb": round(len(slurm.text) / 1e6, 1),
                         **{k: v for k, v in best.items() if k not in ("sent", "frame")}, **stats,
                         "first_sweep_s": runs[rules][0]["sweep_s"],
                         "query_s": _by_kind(best["sent"]),
                         "decoders": decoders(prom, best["sent"], args.decoders) if args.decoders else []})
        by = {r["mode"]: r for r in rows}
        raw, rec = by.get("raw series"), by.get("recording rules")
        interval = 300.0  # the sweep's schedule: the rules run five times per sweep
        cost = rules_cost(prom, _rules_at(prom, now))
        per_interval = cost["rules_samples_per_eval"] * interval / 60.0
        same = (same_answers(min(runs[False], key=lambda r: float(r["sweep_s"]))["frame"],
                             min(runs[True], key=lambda r: float(r["sweep_s"]))["frame"]) if raw and rec else None)
        summary = {"gpus": args.gpus, "samples_loaded": samples, "tsdb_mb": round(tsdb_mb, 1),
                   "build_history_s": t1 - t0, "backfill_rules_s": t2 - t1, "compaction_wait_s": t3 - t2,
                   "blocks_before_compaction": before, "blocks_after": after, "load": _uptime(),
                   "samples_ratio": raw["samples"] / max(1, rec["samples"]) if raw and rec else None, "same_answers": same,
                   **cost, "rules_samples_per_5min": per_interval,
                   "total_samples_per_5min_raw": raw["samples"] if raw else None,
                   "total_samples_per_5min_rules": rec["samples"] + per_interval if rec else None,
                   "target_sweep_under_5s": rec["sweep_s"] < 5.0 if rec else None,
                   "target_10x_fewer_samples": raw["samples"] >= 10 * rec["samples"] if raw and rec else None}
    finally:
        prom.stop()
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        print(json.dumps({"bench": "prometheus", **summary, "results": rows}))
        return
    report("prometheus", rows, ["mode", "gpus", "jobs", "sweep_s", "promql_s", "prom_exec_s", "samples", "peak_samples",
                                "parse_s", "decide_s", "queries", "rules_used", "gpus_seen", "stale", "findings",
                                "decisions", "first_sweep_s"])
    print(json.dumps({"bench": "prometheus-summary", **summary}))
    for k, v in summary.items():
        print(f"{k}: {v}")
    for r in rows:
        print(f"{r['mode']}: samples by query {r['samples_by_query']}, seconds by query {r['query_s']}")
    for r in rows:
        if r["decoders"]:
            report(f"prometheus-decoders ({r['mode']}, {r['gpus']} GPUs, median of {args.decoders})", r["decoders"],
                   ["query", "path", "answer_mb", "series", "library_decode_ms", "msgspec_decode_ms", "decode_ratio",
                    "library_query_ms", "msgspec_query_ms"])


if __name__ == "__main__":
    os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
    main(sys.argv[1:])
