"""A simulated GPU cluster, deterministic for a seed: the embedded default source.

A scenario (YAML) lists nodes and jobs; each job has a *behaviour* that drives the utilisation and
memory of its GPUs over time:

``training``    busy (85-98 %), memory ~85 % of the framebuffer
``zombie``      trains until ``end``, then its process lingers: memory held, 0 %, no job
``idle``        the job runs but its GPUs idle (after ``busy_first`` of real work)
``dataloader``  input-bound: 5-25 % utilisation
``inference``   a service: idle with its model loaded, bursts of traffic every ``burst_every``
``memleak``     busy, memory growing until the framebuffer is full

Times in a scenario are offsets (``-5h``) from an *anchor*: by default the start of the current
UTC day (``anchor: day``), so runs through a day see one consistent cluster whose ladders can
advance; ``anchor: now`` makes the cluster look the same whenever it is observed; an instant
(``anchor: 2026-11-23T00:00:00Z``) pins it for replays. A job ends at its ``end`` or its time limit. Samples, jobs and processes come out
in the trace format of the design (``ts, host, gpu, util, mem_used_mib, ...``) for any time range.
Noise is a hash of (seed, GPU, sample time), so any range gives the same value at the same instant.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import uuid as _uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from gpu_cost import paths
from gpu_cost.errors import ScenarioError
from gpu_cost.model import GpuProcess, Job, Node, labels_from_comment
from gpu_cost.timeutil import epoch, iso, parse_duration

BEHAVIOURS = ("training", "zombie", "idle", "dataloader", "inference", "memleak")
_BEHAVIOUR_CODE = {b: i for i, b in enumerate(BEHAVIOURS)}


@dataclass(frozen=True, slots=True)
class SimNode:
    name: str
    gpus: int = 8
    model: str = "a100"
    mem_total_mib: float = 81920.0
    idle_power_w: float = 60.0
    busy_power_w: float = 400.0
    partitions: tuple[str, ...] = ("batch",)


@dataclass(frozen=True, slots=True)
class SimJob:
    """A job of the scenario; times are offsets (seconds) from the anchor."""

    job_id: str
    user: str
    behaviour: str
    node: str | None = None
    gpus: tuple[int, ...] = ()
    start: float | None = None
    end: float | None = None
    submit: float | None = None
    pending: bool = False
    account: str = ""
    partition: str = "batch"
    qos: str = "normal"
    name: str = ""
    comment: str = ""
    time_limit: float | None = None
    gpus_requested: int = 0
    busy_first: float = 0.0
    burst_every: float = 5400.0
    burst_length: float = 900.0
    #: zombie processes linger this long after the job ends (None: until observed)
    linger: float | None = None
    leak_mib_per_h: float = 4096.0


@dataclass(frozen=True)
class Scenario:
    nodes: tuple[SimNode, ...]
    jobs: tuple[SimJob, ...]
    seed: int = 0
    sample_interval: float = 60.0
    #: "day" (start of the observed UTC day), "now", or epoch seconds
    anchor: float | str = "day"
    source: str = "<scenario>"
    node_index: Mapping[str, int] = field(default_factory=dict)

    @property
    def gpu_count(self) -> int:
        return sum(n.gpus for n in self.nodes)


def load_scenario(path: str | Path | None = None) -> Scenario:
    """Load a scenario file (default: the shipped ``default.yaml``)."""
    p = Path(path) if path is not None else paths.default_scenario()
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ScenarioError(f"{p}: scenario file not found") from None
    except yaml.YAMLError as exc:
        raise ScenarioError(f"{p}: not valid YAML: {exc}") from None
    return scenario_from_dict(data, str(p))


def scenario_from_dict(data: Any, source: str = "<scenario>") -> Scenario:
    """Build a scenario from parsed YAML, with errors that name the file and the entry."""
    if not isinstance(data, Mapping):
        raise ScenarioError(f"{source}: must be a mapping with nodes and jobs")
    unknown = set(data) - {"seed", "sample_interval", "anchor", "nodes", "jobs", "generate"}
    if unknown:
        raise ScenarioError(f"{source}: unknown keys {sorted(unknown)}")
    try:
        interval = parse_duration(data.get("sample_interval", 60))
    except ValueError as exc:
        raise ScenarioError(f"{source}: sample_interval: {exc}") from None
    anchor = data.get("anchor", "day")
    try:
        anchor_ts = anchor if anchor in ("day", "now") else epoch(anchor)
    except ValueError as exc:
        raise ScenarioError(f"{source}: anchor: {exc} (use day, now or an ISO 8601 instant)") from None
    seed = int(data.get("seed", 0))
    if "generate" in data:
        gen = dict(data["generate"] or {})
        sc = generate_scenario(seed=seed, sample_interval=interval, **gen)
        return dataclasses.replace(sc, anchor=anchor_ts, source=source)
    nodes = []
    for i, raw in enumerate(data.get("nodes") or []):
        try:
            raw = dict(raw)
            if "partitions" in raw:
                raw["partitions"] = tuple(raw["partitions"])
            nodes.append(SimNode(**raw))
        except TypeError as exc:
            raise ScenarioError(f"{source}: nodes[{i}]: {exc}") from None
    if not nodes:
        raise ScenarioError(f"{source}: no nodes")
    index = {n.name: i for i, n in enumerate(nodes)}
    jobs = []
    for i, raw in enumerate(data.get("jobs") or []):
        jobs.append(_sim_job(raw, f"{source}: jobs[{i}]", index, nodes))
    return Scenario(tuple(nodes), tuple(jobs), seed, interval, anchor_ts, source, index)


def scenario_to_dict(sc: Scenario) -> dict[str, Any]:
    """Return ``sc`` as the mapping :func:`scenario_from_dict` reads (times as offsets in seconds).

    For writing a generated cluster to a scenario file that other processes load
    (``GPU_COST_SCENARIO``): ``scenario_from_dict(scenario_to_dict(sc))`` is the same cluster.
    """
    defaults = {f.name: f.default for f in dataclasses.fields(SimJob)}
    jobs = []
    for j in sc.jobs:
        row = {k: v for k, v in dataclasses.asdict(j).items() if v is not None and (k == "job_id" or v != defaults[k])}
        row.update({"job_id": j.job_id, "user": j.user, "behaviour": j.behaviour})
        if j.gpus:
            row["gpus"] = list(j.gpus)
        jobs.append(row)
    nodes = [{**dataclasses.asdict(n), "partitions": list(n.partitions)} for n in sc.nodes]
    anchor = sc.anchor if isinstance(sc.anchor, str) else iso(float(sc.anchor))
    return {"seed": sc.seed, "sample_interval": sc.sample_interval, "anchor": anchor, "nodes": nodes, "jobs": jobs}


def _sim_job(raw: Any, where: str, index: Mapping[str, int], nodes: Sequence[SimNode]) -> SimJob:
    if not isinstance(raw, Mapping):
        raise ScenarioError(f"{where}: must be a mapping")
    d = dict(raw)
    try:
        for key in ("start", "end", "submit", "time_limit", "busy_first", "burst_every", "burst_length", "linger"):
            if d.get(key) is not None:
                d[key] = _offset(d[key])
        d["job_id"] = str(d.get("job_id", ""))
        d["gpus"] = tuple(int(g) for g in d.get("gpus") or ())
        job = SimJob(**d)
    except (TypeError, ValueError) as exc:
        raise ScenarioError(f"{where}: {exc}") from None
    if job.behaviour not in BEHAVIOURS:
        raise ScenarioError(f"{where}: behaviour {job.behaviour!r} is not one of {', '.join(BEHAVIOURS)}")
    if not job.job_id:
        raise ScenarioError(f"{where}: job_id is required")
    if not job.pending:
        if job.node not in index:
            raise ScenarioError(f"{where}: node {job.node!r} is not a node of the scenario")
        node = nodes[index[str(job.node)]]
        bad = [g for g in job.gpus if not 0 <= g < node.gpus]
        if bad or not job.gpus:
            raise ScenarioError(f"{where}: gpus {list(job.gpus)} do not fit node {node.name} with {node.gpus} GPUs")
        if job.start is None:
            raise ScenarioError(f"{where}: start is required for a job that is not pending")
        if job.end is not None and job.end <= job.start:
            raise ScenarioError(f"{where}: end is not after start")
        if job.time_limit is not None and (job.end is None or job.end - job.start > job.time_limit):
            job = dataclasses.replace(job, end=job.start + job.time_limit)
    return job


def resolve_anchor(anchor: float | str | None, now: float) -> float:
    """Return the instant scenario offsets count from, for an observation at ``now``."""
    if anchor in (None, "day"):
        return float(now // 86400 * 86400)
    if anchor == "now":
        return float(now)
    return float(anchor)  # type: ignore[arg-type]


def _offset(value: Any) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    text = str(value).strip()
    sign = -1.0 if text.startswith("-") else 1.0
    return sign * parse_duration(text.lstrip("+-"))


def generate_scenario(
    *,
    nodes: int = 16,
    gpus_per_node: int = 8,
    jobs_per_node: float = 2.0,
    pending: int | None = None,
    days: float = 0.0,
    seed: int = 0,
    sample_interval: float = 60.0,
    mix: Mapping[str, float] | None = None,
    model: str = "a100",
    diurnal: bool = False,
    anchor: float | None = None,
) -> Scenario:
    """Return a synthetic cluster: ``nodes`` × ``gpus_per_node`` GPUs, a behaviour mix, a queue.

    With ``days == 0`` the jobs are all running at the anchor (a cluster as one sweep sees it);
    with ``days > 0`` jobs come and go over ``[-days, 0]`` (a trace for replays and reports).
    ``diurnal`` makes arrivals follow working hours (busy weekdays, quiet nights and weekends) in
    UTC, with ``anchor`` the instant offset 0 stands for (the scenario is then pinned to it).
    """
    rng = np.random.default_rng(seed)
    mix = dict(mix or {"training": 0.55, "idle": 0.12, "zombie": 0.08, "dataloader": 0.12, "inference": 0.08, "memleak": 0.05})
    names = list(mix)
    probs = np.array([mix[n] for n in names], dtype=float)
    probs = probs / probs.sum()
    sim_nodes = tuple(SimNode(name=f"n{i:05d}", gpus=gpus_per_node, model=model) for i in range(nodes))
    jobs: list[SimJob] = []
    users = [f"user{i:03d}" for i in range(max(4, nodes // 2))]
    accounts = [f"team{i:02d}" for i in range(max(2, nodes // 16))]
    jid = 100000
    horizon = days * 86400.0
    for n in sim_nodes:
        slots_free = [-horizon] * gpus_per_node
        if days <= 0:
            per_node = max(1, round(jobs_per_node))
            sizes = _split(gpus_per_node, per_node, rng)
            g0 = 0
            for size in sizes:
                jid += 1
                beh = names[rng.choice(len(names), p=probs)]
                start = -float(rng.uniform(1800, 12 * 3600))
                end = -float(rng.uniform(1200, max(1300.0, -start - 600))) if beh == "zombie" else None
                jobs.append(_gen_job(jid, beh, n.name, tuple(range(g0, g0 + size)), start, end, rng, users, accounts))
                g0 += size
            continue
        t = -horizon
        while t < 0:
            size = int(rng.choice([1, 2, 4, 8], p=[0.4, 0.25, 0.2, 0.15]))
            size = min(size, gpus_per_node)
            g0 = int(rng.integers(0, gpus_per_node - size + 1))
            gpus = tuple(range(g0, g0 + size))
            start = max(t, max(slots_free[g] for g in gpus))
            if start >= 0:
                break
            beh = names[rng.choice(len(names), p=probs)]
            # a working-hours cluster runs shorter, interactive-sized jobs
            dur = float(rng.lognormal(math.log((2 if diurnal else 4) * 3600), 0.7 if diurnal else 0.8))
            end = start + dur
            jid += 1
            linger = float(rng.uniform(1800, 6 * 3600)) if beh == "zombie" else None
            jobs.append(_gen_job(jid, beh, n.name, gpus, start, end if end < 0 else None, rng, users, accounts, linger))
            free_at = end + (linger or 0.0)
            for g in gpus:
                slots_free[g] = free_at
            rate = max(jobs_per_node, 0.1) * (_diurnal(anchor + start) if diurnal and anchor is not None else 1.0)
            t = start + float(rng.exponential(3600 / max(rate, 0.02)))
    n_pending = nodes if pending is None else pending
    for _ in range(n_pending):
        jid += 1
        jobs.append(
            SimJob(
                job_id=str(jid), user=users[int(rng.integers(len(users)))], behaviour="training", pending=True,
                submit=-float(rng.uniform(60, 7200)), gpus_requested=int(rng.choice([1, 2, 4, 8])),
                account=accounts[int(rng.integers(len(accounts)))], name=f"queued-{jid}", time_limit=86400.0,
            )
        )
    index = {n.name: i for i, n in enumerate(sim_nodes)}
    pinned: float | str = float(anchor) if anchor is not None else "now"
    return Scenario(sim_nodes, tuple(jobs), seed, sample_interval, pinned, "<generated>", index)


def _diurnal(ts: float) -> float:
    """Return the arrival-rate multiplier of a working-hours cluster at ``ts`` (UTC)."""
    day = int(ts // 86400 + 3) % 7  # 0 = Monday (1970-01-01 was a Thursday)
    hour = (ts % 86400) / 3600.0
    if day >= 5:
        return 0.08
    if 9 <= hour < 19:
        return 1.6
    if 19 <= hour < 22 or 7 <= hour < 9:
        return 0.5
    return 0.03


def _split(total: int, parts: int, rng: np.random.Generator) -> list[int]:
    parts = max(1, min(parts, total))
    cuts = sorted(rng.choice(np.arange(1, total), size=parts - 1, replace=False).tolist()) if parts > 1 else []
    edges = [0, *cuts, total]
    return [b - a for a, b in itertools.pairwise(edges)]


def _gen_job(jid: int, beh: str, node: str, gpus: tuple[int, ...], start: float, end: float | None,
             rng: np.random.Generator, users: list[str], accounts: list[str], linger: float | None = None) -> SimJob:
    if beh == "zombie" and end is None:
        end = start + float(rng.uniform(1800, 4 * 3600))
    limit = float(rng.choice([4, 8, 12, 24, 48])) * 3600
    if end is not None:
        limit = max(limit, end - start + 600)
    return SimJob(
        job_id=str(jid), user=users[int(rng.integers(len(users)))], behaviour=beh, node=node, gpus=gpus,
        start=start, end=end, account=accounts[int(rng.integers(len(accounts)))],
        name=("serve-" if beh == "inference" else "job-") + str(jid), time_limit=limit,
        busy_first=float(rng.uniform(0, 3600)) if beh == "idle" else 0.0, linger=linger,
    )


def _noise(seed: int, gpu_ids: np.ndarray, t_idx: np.ndarray) -> np.ndarray:
    """Return uniform [0, 1) noise for each (GPU, sample index): a splitmix64 hash, no state."""
    with np.errstate(over="ignore"):
        x = (gpu_ids.astype(np.uint64)[:, None] * np.uint64(0x9E3779B97F4A7C15)) ^ (
            t_idx.astype(np.uint64)[None, :] * np.uint64(0xBF58476D1CE4E5B9)
        )
        x ^= np.uint64(seed & 0xFFFFFFFF) * np.uint64(0x94D049BB133111EB)
        x ^= x >> np.uint64(30)
        x *= np.uint64(0xBF58476D1CE4E5B9)
        x ^= x >> np.uint64(27)
        x *= np.uint64(0x94D049BB133111EB)
        x ^= x >> np.uint64(31)
    return (x >> np.uint64(11)).astype(np.float64) / float(1 << 53)


@dataclass
class GpuMatrix:
    """Dense samples: one row per GPU, one column per sample time; NaN where no sample exists."""

    times: np.ndarray
    hosts: np.ndarray
    gpus: np.ndarray
    uuids: np.ndarray
    models: np.ndarray
    mem_total: np.ndarray
    util: np.ndarray
    mem: np.ndarray
    power: np.ndarray
    job: np.ndarray  # object array of job ids ("" when none) per GPU × time


class SimCluster:
    """Observe a scenario at any time: samples, jobs, processes and nodes.

    :param anchor: the instant offsets are measured from (the scenario's own anchor wins).
    """

    def __init__(self, scenario: Scenario, anchor: float) -> None:
        self.scenario = scenario
        self.anchor = resolve_anchor(scenario.anchor, anchor)
        hosts: list[str] = []
        gpus: list[int] = []
        uuids: list[str] = []
        models: list[str] = []
        totals: list[float] = []
        idle_w: list[float] = []
        busy_w: list[float] = []
        self._row: dict[tuple[str, int], int] = {}
        for node in scenario.nodes:
            for g in range(node.gpus):
                self._row[(node.name, g)] = len(hosts)
                hosts.append(node.name)
                gpus.append(g)
                uuids.append(gpu_uuid(node.name, g))
                models.append(node.model)
                totals.append(node.mem_total_mib)
                idle_w.append(node.idle_power_w)
                busy_w.append(node.busy_power_w)
        self.hosts = np.array(hosts, dtype=object)
        self.gpu_idx = np.array(gpus, dtype=np.int64)
        self.uuids = np.array(uuids, dtype=object)
        self.models = np.array(models, dtype=object)
        self.mem_total = np.array(totals, dtype=float)
        self.idle_w = np.array(idle_w, dtype=float)
        self.busy_w = np.array(busy_w, dtype=float)
        self._jobs = [j for j in scenario.jobs]

    # -- times -----------------------------------------------------------------------------
    def abs_ts(self, offset: float | None) -> float | None:
        return None if offset is None else self.anchor + offset

    def sample_times(self, start: float, end: float) -> np.ndarray:
        """Return sample instants in ``(start, end]`` on the scenario's sample grid."""
        step = self.scenario.sample_interval
        first = math.floor(start / step) + 1
        last = math.floor(end / step)
        return np.arange(first, last + 1, dtype=np.int64) * step

    # -- samples ---------------------------------------------------------------------------
    def matrix(self, start: float, end: float) -> GpuMatrix:
        """Return dense samples for every GPU in ``(start, end]``."""
        times = self.sample_times(start, end).astype(float)
        n_g, n_t = len(self.hosts), len(times)
        t_idx = np.round(times / self.scenario.sample_interval).astype(np.int64)
        noise = _noise(self.scenario.seed, np.arange(n_g), t_idx)
        util = np.zeros((n_g, n_t))
        mem = np.zeros((n_g, n_t))
        active = np.zeros((n_g, n_t), dtype=bool)
        job = np.full((n_g, n_t), "", dtype=object)
        for j in self._jobs:
            if j.pending or j.start is None:
                continue
            s = self.anchor + j.start
            e = math.inf if j.end is None else self.anchor + j.end
            tail = e
            if j.behaviour == "zombie" and j.end is not None:
                tail = math.inf if j.linger is None else e + j.linger
            lo = int(np.searchsorted(times, s, side="left"))
            hi = int(np.searchsorted(times, tail, side="left"))
            if hi <= lo:
                continue
            rows = np.array([self._row[(j.node, g)] for g in j.gpus])  # type: ignore[index]
            tt = times[lo:hi]
            tau = tt - s
            nz = noise[rows][:, lo:hi]
            total = self.mem_total[rows][:, None]
            u, m = _behaviour(j, tau, nz, total, e - s)
            util[rows, lo:hi] = u
            mem[rows, lo:hi] = m
            active[rows, lo:hi] = True
            in_job = tt < e
            if in_job.any():
                block = job[rows, lo:hi]
                block[:, in_job] = j.job_id
                job[rows, lo:hi] = block
        util = np.clip(util, 0, 100)
        mem = np.clip(mem, 0, self.mem_total[:, None])
        power = self.idle_w[:, None] + (self.busy_w - self.idle_w)[:, None] * (util / 100.0)
        # idle, empty GPUs still report (DCGM samples every GPU); a little noise on memory for realism
        mem = np.where(active, mem, 0.0)
        return GpuMatrix(times, self.hosts, self.gpu_idx, self.uuids, self.models, self.mem_total, util, mem, power, job)

    def samples(self, start: float, end: float) -> pd.DataFrame:
        """Return samples in ``(start, end]`` in the trace format (long, one row per GPU × time)."""
        return long_samples(self.matrix(start, end))

    # -- scheduler view --------------------------------------------------------------------
    def jobs_at(self, t: float, include_finished: bool = False) -> list[Job]:
        """Return the jobs as the scheduler shows them at ``t`` (running and pending; finished on request)."""
        out = []
        for j in self._jobs:
            job = self._job_record(j, t)
            if job is None:
                continue
            if job.running or job.pending or include_finished:
                out.append(job)
        return out

    def _job_record(self, j: SimJob, t: float) -> Job | None:
        submit = self.abs_ts(j.submit) if j.submit is not None else self.abs_ts(j.start)
        if submit is not None and submit > t:
            return None
        start = self.abs_ts(j.start)
        end = self.abs_ts(j.end)
        if j.pending or start is None or start > t:
            state, start_ts, end_ts = "PENDING", None, None
        elif end is not None and end <= t:
            state, start_ts, end_ts = "COMPLETED", start, end
        else:
            state, start_ts, end_ts = "RUNNING", start, None
        alloc = ((j.node, j.gpus),) if state != "PENDING" and j.node else ()
        return Job(
            job_id=j.job_id, user=j.user, state=state, start_ts=start_ts, account=j.account, partition=j.partition,
            qos=j.qos, name=j.name or f"job-{j.job_id}", comment=j.comment, submit_ts=submit, end_ts=end_ts,
            time_limit_s=j.time_limit, nodes=(j.node,) if alloc and j.node else (), gpu_alloc=alloc,
            gpus_requested=j.gpus_requested or len(j.gpus), labels=labels_from_comment(j.comment),
        )

    def jobs_trace(self, start: float, end: float) -> pd.DataFrame:
        """Return every job that ran in ``[start, end]`` in the trace's jobs format."""
        rows = []
        for j in self._jobs:
            if j.pending or j.start is None:
                continue
            s = self.anchor + j.start
            e = None if j.end is None else self.anchor + j.end
            if s > end or (e is not None and e < start):
                continue
            rows.append(
                {
                    "job_id": j.job_id, "user": j.user, "account": j.account, "partition": j.partition,
                    "name": j.name or f"job-{j.job_id}", "state": "COMPLETED" if e is not None and e <= end else "RUNNING",
                    "submit_ts": s if j.submit is None else self.anchor + j.submit, "start_ts": s, "end_ts": e,
                    "time_limit_s": j.time_limit, "gpus": len(j.gpus), "nodes": j.node,
                    "gpu_ids": ",".join(f"{j.node}:{g}" for g in j.gpus), "labels": ",".join(labels_from_comment(j.comment)),
                    "behaviour": j.behaviour,
                }
            )
        return pd.DataFrame(rows)

    def processes_at(self, t: float) -> list[GpuProcess]:
        """Return GPU processes as ``nvidia-smi`` plus ``/proc`` would show them at ``t``."""
        m = self.matrix(t - self.scenario.sample_interval, t)
        out = []
        for j in self._jobs:
            if j.pending or j.start is None:
                continue
            s = self.anchor + j.start
            e = math.inf if j.end is None else self.anchor + j.end
            if s > t:
                continue
            zombie_tail = j.behaviour == "zombie" and e <= t and (j.linger is None or t < e + j.linger)
            if e <= t and not zombie_tail:
                continue
            if j.behaviour == "idle" and t - s > j.busy_first:
                continue  # the training process exited; the allocation sits empty
            pid = sim_pid(j.job_id)
            for g in j.gpus:
                row = self._row[(j.node, g)]  # type: ignore[index]
                used = float(m.mem[row, -1]) if m.mem.shape[1] else 0.0
                out.append(
                    GpuProcess(
                        host=j.node or "", pid=pid, gpu_uuid=self.uuids[row], gpu=g, used_mib=round(used, 1),
                        start_ts=float(int(s)), job_id=None if zombie_tail else j.job_id, user=j.user,
                        name="python",
                    )
                )
        return out

    def nodes_at(self, t: float) -> list[Node]:
        alloc: dict[str, int] = {}
        for job in self.jobs_at(t):
            for host, idx in job.gpu_alloc:
                alloc[host] = alloc.get(host, 0) + len(idx)
        out = []
        for n in self.scenario.nodes:
            used = alloc.get(n.name, 0)
            state = "idle" if used == 0 else ("allocated" if used >= n.gpus else "mixed")
            out.append(Node(name=n.name, state=state, gpus_total=n.gpus, gpus_alloc=used, gpu_model=n.model,
                            partitions=n.partitions, power_w=n.idle_power_w * n.gpus))
        return out


def _behaviour(j: SimJob, tau: np.ndarray, noise: np.ndarray, total: np.ndarray, dur: float) -> tuple[np.ndarray, np.ndarray]:
    """Return (util %, memory MiB) for a job's GPUs at job-relative times ``tau``."""
    shape = noise.shape
    tau2 = np.broadcast_to(tau, shape)
    if j.behaviour == "training":
        return 85 + 13 * noise, np.broadcast_to(total * 0.85, shape) + 200 * noise
    if j.behaviour == "zombie":
        running = tau2 < dur
        util = np.where(running, 85 + 13 * noise, 0.0)
        mem = np.where(running, total * 0.85, total * 0.45) + 50 * noise
        return util, mem
    if j.behaviour == "idle":
        busy = tau2 < j.busy_first
        util = np.where(busy, 85 + 13 * noise, 0.4 * noise)
        mem = np.where(busy, total * 0.7, 0.0) + np.where(busy, 100 * noise, 0.0)
        return util, mem
    if j.behaviour == "dataloader":
        return 5 + 20 * noise, np.broadcast_to(total * 0.4, shape) + 100 * noise
    if j.behaviour == "inference":
        phase = np.mod(tau2, j.burst_every)
        burst = phase < j.burst_length
        util = np.where(burst, 60 + 30 * noise, 0.3 * noise)
        mem = np.broadcast_to(total * 0.6, shape) + 30 * noise
        return util, mem
    if j.behaviour == "memleak":
        mem = total * 0.3 + j.leak_mib_per_h * tau2 / 3600.0
        return 85 + 13 * noise, np.minimum(mem, total)
    raise ScenarioError(f"unknown behaviour {j.behaviour!r}")


def long_samples(m: GpuMatrix, **extra: np.ndarray) -> pd.DataFrame:
    """Return a dense matrix as trace-format samples (one row per GPU × time); ``extra`` GPU × time columns too."""
    n_g, n_t = m.util.shape
    columns = {
        "ts": np.tile(m.times, n_g).astype(np.int64),
        "host": np.repeat(m.hosts, n_t),
        "gpu": np.repeat(m.gpus, n_t),
        "util": np.round(m.util.ravel(), 2),
        "mem_used_mib": np.round(m.mem.ravel(), 1),
        "uuid": np.repeat(m.uuids, n_t),
        "mem_total_mib": np.repeat(m.mem_total, n_t),
        "power_w": np.round(m.power.ravel(), 1),
        "job_id": m.job.ravel(),
    }
    columns.update({name: values.ravel() for name, values in extra.items()})
    return pd.DataFrame(columns)


def sim_pid(job_id: str) -> int:
    """Return the PID the simulator gives a job's processes (stable, derived from the job id)."""
    return 10000 + (int("".join(c for c in job_id if c.isdigit()) or "0") % 50000)


def gpu_uuid(host: str, index: int) -> str:
    """Return a stable, realistic-looking GPU UUID for a simulated GPU."""
    return "GPU-" + str(_uuid.uuid5(_uuid.NAMESPACE_DNS, f"{host}.gpu{index}.gpu-cost.sim"))


def snapshot(policy: Any, now: float, scenario: Scenario | None = None) -> Any:
    """Return what the agent would see of the simulated cluster at ``now``."""
    from gpu_cost.snapshot import from_matrix

    sc = scenario or load_scenario()
    cluster = SimCluster(sc, anchor=now)
    m = cluster.matrix(now - policy.sweep.lookback, now)
    return from_matrix(
        policy=policy, now=now, source="sim", hosts=m.hosts, gpus=m.gpus, uuids=m.uuids, models=m.models,
        mem_total=m.mem_total, times=m.times, util=m.util, mem=m.mem, power=m.power, job=m.job,
        jobs=cluster.jobs_at(now), processes=cluster.processes_at(now), nodes=cluster.nodes_at(now),
    )
