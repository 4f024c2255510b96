"""A simulated GPU cluster, deterministic for a seed: the embedded default source.

A scenario (YAML) lists nodes and jobs; each job has a *behaviour* that drives the utilisation and
memory of its GPUs over time:

``training``    busy (85-98 %), memory ~85 % of the framebuffer
``zombie``      trains until ``end``, then its process lingers: memory held, 0 %, no job
``idle``        the job runs but its GPUs idle (after ``busy_first`` of real work)
``dataloader``  input-bound: 5-25 % utilisation
``inference``   a service: idle with its model loaded, bursts of traffic every ``burst_every``
``memleak``     busy, memory growing until the framebuffer is full

The *hard* behaviours of real clusters (``generate_scenario(behaviours="hard")``, ``gpu-cost
sim-trace --behaviours hard``), which look idle to a utilisation threshold but are not, or look
busy but are waste:

``service``     a long-lived endpoint: model resident (~60 % of the framebuffer), quiet (0-0.5 %)
                for hours, bursts of traffic at random times (gaps in ``[burst_every, gap_max]``)
``checkpoint``  training that pauses every ``burst_every`` for ``burst_length`` (0-2 %) to write a checkpoint
``dataload``    reads its data first (``load_time`` at 0-2 %, ``mem_mib`` held), then trains
``finished``    trains ``busy_first``, says so, then its process holds ~45 % of the memory at 0 % until the end
``crashed``     trains ``busy_first``, dies with a traceback; the allocation is held by a sleeping wrapper
``interactive`` a salloc / Jupyter session (``batch`` False): 0 % with short bursts, a little memory

Each job also writes a log (:meth:`SimCluster.log_lines`): progress lines while it trains, the
lines of its phases (checkpoints, data loading, the finish, the traceback), access lines of a
service's bursts; the live snapshot reads the tails of the jobs a rule may find idle.

A scenario may also list Slurm ``reservations:`` (``{name, nodes, start, end, users, accounts, flags,
partition}``), listed by the snapshot as ``scontrol show reservation`` would from their start until
their end (the idle-reservation rule's input).

Times in a scenario are offsets (``-5h``) from an *anchor*: by default the start of the current
UTC day (``anchor: day``), so runs through a day see one consistent cluster whose ladders can
advance; ``anchor: now`` makes the cluster look the same whenever it is observed; an instant
(``anchor: 2026-11-23T00:00:00Z``) pins it for replays. A job ends at its ``end`` or its time limit. Samples, jobs and processes come out
in the trace format of the design (``ts, host, gpu, util, mem_used_mib, ...``) for any time range.
Noise is a hash of (seed, GPU, sample time), so any range gives the same value at the same instant.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import uuid as _uuid
import zlib
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from gpu_cost.core import paths
from gpu_cost.core.errors import ScenarioError
from gpu_cost.core.model import GpuProcess, Job, Node, Reservation, labels_from_comment, mig_share
from gpu_cost.core.timeutil import epoch, iso, parse_duration

#: the behaviours real clusters make hard: quiet but working, or busy-looking but waste
HARD_BEHAVIOURS = ("service", "checkpoint", "dataload", "finished", "crashed", "interactive")
#: the pods of a serving fleet (:func:`serving_fleet`): replicas of one model, and pods that never computed
FLEET_BEHAVIOURS = ("replica", "never_active")
BEHAVIOURS = ("training", "zombie", "idle", "dataloader", "inference", "memleak", *HARD_BEHAVIOURS,
              *FLEET_BEHAVIOURS)
_BEHAVIOUR_CODE = {b: i for i, b in enumerate(BEHAVIOURS)}

#: behaviour mixes of :func:`generate_scenario` (``behaviours=``); ``hard`` adds a service fleet
MIXES: dict[str, dict[str, float]] = {
    "basic": {"training": 0.55, "idle": 0.12, "zombie": 0.08, "dataloader": 0.12, "inference": 0.08, "memleak": 0.05},
    "hard": {"training": 0.22, "checkpoint": 0.14, "dataload": 0.10, "finished": 0.09, "crashed": 0.07,
             "interactive": 0.12, "idle": 0.07, "zombie": 0.06, "dataloader": 0.05, "inference": 0.03,
             "memleak": 0.05},
}
#: names of the service fleet: none matches the policy's inference name globs (the agent must see the behaviour)
SERVICE_NAMES = ("llama7b-endpoint", "ranker-api", "embedder-api", "mistral-chat-endpoint", "rerank-api",
                 "codegen-endpoint", "whisper-asr-api", "clip-embed-api")
SERVICE_ACCOUNT = "serving"
SERVICE_USERS = ("mlops", "svc-llm")
INTERACTIVE_NAMES = ("jupyter", "interactive", "bash")
#: what a data-loader-bound job's own processes use (the node wrapper's ``job-log`` activity sample):
#: CPU cores per GPU it holds, and bytes per second read from storage
DATALOADER_CORES_PER_GPU = 3.5
DATALOADER_IO_BPS = 420.0 * 1048576
#: a progress line every this many seconds while a job trains
PROGRESS_EVERY = 300.0


@dataclass(frozen=True, slots=True)
class SimNode:
    name: str
    gpus: int = 8
    model: str = "a100"
    mem_total_mib: float = 81920.0
    idle_power_w: float = 60.0
    busy_power_w: float = 400.0
    partitions: tuple[str, ...] = ("batch",)
    #: MIG layout: GPU index → its slices' profiles (``{0: [3g.40gb, 2g.20gb, 1g.10gb]}``); each slice is
    #: a device of its own with GPU instance ids 1, 2, ... in the order listed
    mig: tuple[tuple[int, tuple[str, ...]], ...] = ()

    def slices(self, gpu: int) -> tuple[str, ...]:
        """Return the MIG profiles of GPU ``gpu`` (empty: a whole GPU)."""
        return next((p for g, p in self.mig if g == gpu), ())


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
    #: zombie: the lingering process still names its former job (``SLURM_JOB_ID`` in its environment, as a
    #: process that escaped the job's cgroup does on a real node); False: it names no job
    keeps_job_id: bool = False
    leak_mib_per_h: float = 4096.0
    #: service / interactive: the time between bursts is uniform in [burst_every, gap_max] (None: burst_every)
    gap_max: float | None = None
    #: service / interactive: a burst lasts uniform [burst_min, burst_length] (None: burst_length)
    burst_min: float | None = None
    #: share of the framebuffer held (service: the resident model, default 0.6; finished: after it, default 0.45)
    mem_share: float | None = None
    #: framebuffer held (MiB): dataload while loading (default 3072), interactive (default 4096)
    mem_mib: float | None = None
    #: dataload: how long the data-loading phase lasts
    load_time: float = 3600.0
    #: crashed: how it died, ``oom`` (CUDA out of memory) or ``nccl`` (NCCL watchdog timeout)
    failure: str = "oom"
    #: Slurm's batch flag (None: False for ``interactive``, True otherwise)
    batch: bool | None = None
    #: replica: no request reaches it for this long after its start (a replica the balancer starves)
    quiet_until: float = 0.0
    #: replica: the set's peaks, ``(start, end)`` offsets from the anchor, when every replica it feeds is busy
    peaks: tuple[tuple[float, float], ...] = ()
    #: seed of the job's own random schedule (bursts of services and sessions)
    rseed: int = 0
    #: MIG slices the job holds on ``node``: ``<gpu>/<GPU instance id>`` (``0/2``)
    mig: tuple[str, ...] = ()
    #: the job's GPUs on further nodes (a multi-node job): ``{gpu02: [0, 1, 2, 3]}``
    also: tuple[tuple[str, tuple[int, ...]], ...] = ()
    #: this many of the job's GPUs (the last ones, across its nodes) sit idle while the others work
    idle_gpus: int = 0
    #: the job shares its GPUs with other jobs (Slurm shard / MPS gres, time-slicing): their
    #: utilisation and memory add up on the device
    shared: bool = False

    @property
    def is_batch(self) -> bool:
        return self.batch if self.batch is not None else self.behaviour != "interactive"


@dataclass(frozen=True, slots=True)
class SimReservation:
    """A Slurm reservation of the scenario, as ``scontrol create reservation`` would make it; times are
    offsets (seconds) from the anchor. Active from ``start`` to ``end``; listed before it starts."""

    name: str
    nodes: tuple[str, ...]
    start: float
    end: float
    users: tuple[str, ...] = ()
    accounts: tuple[str, ...] = ()
    #: Slurm's flags, e.g. ``[WEEKLY]``, ``[MAINT, IGNORE_JOBS]`` (upper-cased as Slurm shows them)
    flags: tuple[str, ...] = ()
    partition: str = ""


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
    reservations: tuple[SimReservation, ...] = ()

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
    unknown = set(data) - {"seed", "sample_interval", "anchor", "nodes", "jobs", "generate", "reservations"}
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
        resv = _sim_reservations(data.get("reservations"), source, sc.node_index)
        return dataclasses.replace(sc, anchor=anchor_ts, source=source, reservations=resv)
    nodes = []
    for i, raw in enumerate(data.get("nodes") or []):
        try:
            raw = dict(raw)
            if "partitions" in raw:
                raw["partitions"] = tuple(raw["partitions"])
            if "mig" in raw:
                raw["mig"] = _mig_layout(raw["mig"], f"{source}: nodes[{i}]")
            nodes.append(SimNode(**raw))
        except TypeError as exc:
            raise ScenarioError(f"{source}: nodes[{i}]: {exc}") from None
    if not nodes:
        raise ScenarioError(f"{source}: no nodes")
    index = {n.name: i for i, n in enumerate(nodes)}
    jobs = []
    for i, raw in enumerate(data.get("jobs") or []):
        jobs.append(_sim_job(raw, f"{source}: jobs[{i}]", index, nodes))
    return Scenario(tuple(nodes), tuple(jobs), seed, interval, anchor_ts, source, index,
                    _sim_reservations(data.get("reservations"), source, index))


def _sim_reservations(raw: Any, source: str, index: Mapping[str, int]) -> tuple[SimReservation, ...]:
    """Return a scenario's ``reservations:`` (``{name, nodes, start, end, users, accounts, flags, partition}``)."""
    if raw is None:
        return ()
    if not isinstance(raw, Sequence) or isinstance(raw, str):
        raise ScenarioError(f"{source}: reservations must be a list")
    out: list[SimReservation] = []
    for i, item in enumerate(raw):
        where = f"{source}: reservations[{i}]"
        if not isinstance(item, Mapping):
            raise ScenarioError(f"{where}: must be a mapping")
        d = dict(item)
        try:
            for key in ("start", "end"):
                if d.get(key) is None:
                    raise ValueError(f"{key} is required")
                d[key] = _offset(d[key])
            for key in ("nodes", "users", "accounts"):
                d[key] = tuple(str(x) for x in d.get(key) or ())
            d["flags"] = tuple(str(x).upper() for x in d.get("flags") or ())
            r = SimReservation(**d)
        except (TypeError, ValueError) as exc:
            raise ScenarioError(f"{where}: {exc}") from None
        if not r.name:
            raise ScenarioError(f"{where}: name is required")
        if r.name in {o.name for o in out}:
            raise ScenarioError(f"{where}: a second reservation named {r.name!r}")
        missing = [h for h in r.nodes if h not in index]
        if not r.nodes or missing:
            raise ScenarioError(f"{where}: nodes {missing or '[]'} are not nodes of the scenario")
        if r.end <= r.start:
            raise ScenarioError(f"{where}: end is not after start")
        out.append(r)
    return tuple(out)


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
    for node, raw in zip(sc.nodes, nodes, strict=True):
        raw.pop("mig")
        if node.mig:
            raw["mig"] = {g: list(p) for g, p in node.mig}
    for row in jobs:
        if "also" in row:
            row["also"] = {h: list(g) for h, g in row["also"]}
        if "mig" in row:
            row["mig"] = list(row["mig"])
        if "peaks" in row:
            row["peaks"] = [list(p) for p in row["peaks"]]
    anchor = sc.anchor if isinstance(sc.anchor, str) else iso(float(sc.anchor))
    out = {"seed": sc.seed, "sample_interval": sc.sample_interval, "anchor": anchor, "nodes": nodes, "jobs": jobs}
    if sc.reservations:
        out["reservations"] = [{k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(r).items()}
                               for r in sc.reservations]
    return out


def _sim_job(raw: Any, where: str, index: Mapping[str, int], nodes: Sequence[SimNode]) -> SimJob:
    if not isinstance(raw, Mapping):
        raise ScenarioError(f"{where}: must be a mapping")
    d = dict(raw)
    try:
        for key in ("start", "end", "submit", "time_limit", "busy_first", "burst_every", "burst_length", "linger",
                    "gap_max", "burst_min", "load_time"):
            if d.get(key) is not None:
                d[key] = _offset(d[key])
        d["job_id"] = str(d.get("job_id", ""))
        d["gpus"] = tuple(int(g) for g in d.get("gpus") or ())
        d["mig"] = tuple(str(x) for x in d.get("mig") or ())
        d["peaks"] = tuple((_offset(a), _offset(b)) for a, b in d.get("peaks") or ())
        if d.get("quiet_until") is not None:
            d["quiet_until"] = _offset(d["quiet_until"])
        also = d.get("also") or {}
        d["also"] = tuple((str(h), tuple(int(g) for g in gs)) for h, gs in (also.items() if isinstance(also, Mapping) else also))
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
        bad = [g for g in job.gpus if not 0 <= g < node.gpus or node.slices(g)]
        if bad or not (job.gpus or job.mig):
            raise ScenarioError(f"{where}: gpus {list(job.gpus)} do not fit node {node.name} with {node.gpus} GPUs"
                                + (" (a MIG GPU is held by its slices: mig: [<gpu>/<instance>])" if bad else ""))
        for sl in job.mig:
            g, _, gi = sl.partition("/")
            if not (g.isdigit() and gi.isdigit() and 1 <= int(gi) <= len(node.slices(int(g)))):
                raise ScenarioError(f"{where}: MIG slice {sl!r} is not a slice of node {node.name}")
        for host, gs in job.also:
            if host not in index:
                raise ScenarioError(f"{where}: also: node {host!r} is not a node of the scenario")
            other = nodes[index[host]]
            if not gs or any(not 0 <= g < other.gpus or other.slices(g) for g in gs):
                raise ScenarioError(f"{where}: also: gpus {list(gs)} do not fit node {host} with {other.gpus} GPUs")
        if job.start is None:
            raise ScenarioError(f"{where}: start is required for a job that is not pending")
        if job.end is not None and job.end <= job.start:
            raise ScenarioError(f"{where}: end is not after start")
        if job.time_limit is not None and (job.end is None or job.end - job.start > job.time_limit):
            job = dataclasses.replace(job, end=job.start + job.time_limit)
    return job


def _mig_layout(raw: Any, where: str) -> tuple[tuple[int, tuple[str, ...]], ...]:
    from gpu_cost.core.model import mig_share

    if not isinstance(raw, Mapping):
        raise ScenarioError(f"{where}: mig must map a GPU index to its slices' profiles")
    out = []
    for g, profiles in raw.items():
        plist = tuple(str(p) for p in (profiles or ()))
        try:
            total = sum(mig_share(p) for p in plist)
        except ValueError as exc:
            raise ScenarioError(f"{where}: mig[{g}]: {exc}") from None
        if not plist or total > 1.0 + 1e-9:
            raise ScenarioError(f"{where}: mig[{g}]: slices {list(plist)} do not fit one GPU (7 compute slices)")
        out.append((int(g), plist))
    return tuple(sorted(out))


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
    behaviours: str = "basic",
) -> Scenario:
    """Return a synthetic cluster: ``nodes`` × ``gpus_per_node`` GPUs, a behaviour mix, a queue.

    With ``days == 0`` the jobs are all running at the anchor (a cluster as one sweep sees it);
    with ``days > 0`` jobs come and go over ``[-days, 0]`` (a trace for replays and reports).
    ``diurnal`` makes arrivals follow working hours (busy weekdays, quiet nights and weekends) in
    UTC, with ``anchor`` the instant offset 0 stands for (the scenario is then pinned to it).

    ``behaviours`` names the mix (:data:`MIXES`; ``mix`` overrides its weights): ``basic`` (the
    default, the same cluster as ever for a seed) or ``hard``, the behaviours of real clusters that
    fool a threshold: checkpoint and data-loading phases, finished and crashed jobs that keep their
    allocation, interactive sessions, and a fleet of long-lived service endpoints (about one per
    node, at least 6, on GPUs of their own, running from before ``-days`` to past the end).
    """
    if behaviours == "serving-fleet":
        return serving_fleet(nodes=nodes, gpus_per_node=gpus_per_node, days=days or 1.0, seed=seed,
                             sample_interval=sample_interval, model=model, anchor=anchor)
    if behaviours not in MIXES:
        raise ScenarioError(f"behaviours {behaviours!r} is not one of {', '.join([*MIXES, 'serving-fleet'])}")
    hard = behaviours == "hard"
    rng = np.random.default_rng(seed)
    mix = dict(mix or MIXES[behaviours])
    unknown = sorted(set(mix) - set(BEHAVIOURS))
    if unknown:
        raise ScenarioError(f"mix: unknown behaviours {unknown}")
    names = list(mix)
    probs = np.array([mix[n] for n in names], dtype=float)
    probs = probs / probs.sum()
    partitions = ("batch", "interactive") if hard else ("batch",)
    sim_nodes = tuple(SimNode(name=f"n{i:05d}", gpus=gpus_per_node, model=model, partitions=partitions)
                      for i in range(nodes))
    jobs: list[SimJob] = []
    users = [f"user{i:03d}" for i in range(max(4, nodes // 2))]
    accounts = [f"team{i:02d}" for i in range(max(2, nodes // 16))]
    jid = 100000
    horizon = days * 86400.0
    reserved: dict[str, int] = {}
    if hard:
        fleet, reserved = _service_fleet(sim_nodes, np.random.default_rng([seed, 0x5E7F1EE7]), horizon)
        jobs.extend(fleet)
    for n in sim_nodes:
        # GPUs at the top of a node held by the service fleet are out of the batch jobs' reach
        avail = gpus_per_node - reserved.get(n.name, 0)
        if avail <= 0:
            continue
        slots_free = [-horizon] * gpus_per_node
        if days <= 0:
            per_node = max(1, round(jobs_per_node))
            sizes = _split(avail, per_node, rng)
            g0 = 0
            for size in sizes:
                jid += 1
                beh = names[rng.choice(len(names), p=probs)]
                start = -float(rng.uniform(1800, 12 * 3600))
                end = -float(rng.uniform(1200, max(1300.0, -start - 600))) if beh == "zombie" else None
                gpus = tuple(range(g0, g0 + size))
                extra: dict[str, Any] = {}
                if beh in HARD_BEHAVIOURS:
                    dur, cap, extra = _hard_shape(beh, 0.0, rng)
                    gpus = gpus[:cap] if cap else gpus
                    if beh == "interactive":
                        start = -float(rng.uniform(600, dur - 300))  # a session still open at the anchor
                job = _gen_job(jid, beh, n.name, gpus, start, end, rng, users, accounts, extra=extra)
                if beh in HARD_BEHAVIOURS and (job.time_limit or 0) < -start + 1800:
                    job = dataclasses.replace(job, time_limit=math.ceil((-start + 1800) / 3600) * 3600.0)
                jobs.append(job)
                g0 += size
            continue
        t = -horizon
        while t < 0:
            size = int(rng.choice([1, 2, 4, 8], p=[0.4, 0.25, 0.2, 0.15]))
            size = min(size, avail)
            g0 = int(rng.integers(0, avail - size + 1))
            gpus = tuple(range(g0, g0 + size))
            start = max(t, max(slots_free[g] for g in gpus))
            if start >= 0:
                break
            beh = names[rng.choice(len(names), p=probs)]
            # a working-hours cluster runs shorter, interactive-sized jobs
            dur = float(rng.lognormal(math.log((2 if diurnal else 4) * 3600), 0.7 if diurnal else 0.8))
            extra = {}
            if beh in HARD_BEHAVIOURS:
                dur, cap, extra = _hard_shape(beh, dur, rng)
                gpus = gpus[:cap] if cap else gpus
            end = start + dur
            jid += 1
            linger = float(rng.uniform(1800, 6 * 3600)) if beh == "zombie" else None
            jobs.append(_gen_job(jid, beh, n.name, gpus, start, end if end < 0 else None, rng, users, accounts, linger,
                                 extra=extra))
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
             rng: np.random.Generator, users: list[str], accounts: list[str], linger: float | None = None,
             extra: Mapping[str, Any] | None = None) -> SimJob:
    """Return a generated job; ``extra`` (from :func:`_hard_shape`) sets the fields of a hard behaviour."""
    if beh == "zombie" and end is None:
        end = start + float(rng.uniform(1800, 4 * 3600))
    limit = float(rng.choice([4, 8, 12, 24, 48])) * 3600
    extra = dict(extra or {})
    forced = extra.pop("time_limit", None)
    if end is not None:
        limit = max(limit, end - start + 600)
    if forced is not None:  # a hard behaviour's own limit (a job held until its limit ends exactly there)
        limit = max(float(forced), end - start if end is not None else 0.0)
    fields: dict[str, Any] = {
        "job_id": str(jid), "user": users[int(rng.integers(len(users)))], "behaviour": beh, "node": node, "gpus": gpus,
        "start": start, "end": end, "account": accounts[int(rng.integers(len(accounts)))],
        "name": ("serve-" if beh == "inference" else "job-") + str(jid), "time_limit": limit,
        "busy_first": float(rng.uniform(0, 3600)) if beh == "idle" else 0.0, "linger": linger,
    }
    fields.update(extra)
    return SimJob(**fields)


def _hard_shape(beh: str, dur: float, rng: np.random.Generator) -> tuple[float, int, dict[str, Any]]:
    """Return ``(duration, GPU cap or 0, SimJob fields)`` of a generated job with a hard behaviour.

    ``dur`` is the duration the arrival process drew (0 for a cluster observed at one instant);
    the behaviour stretches or replaces it so that its phases fit.
    """
    h = 3600.0
    if beh == "checkpoint":
        period, pause = float(rng.uniform(1.5 * h, 3 * h)), float(rng.uniform(600, 1500))
        return max(dur, float(rng.uniform(6 * h, 20 * h))), 0, {"burst_every": period, "burst_length": pause}
    if beh == "dataload":
        load = float(rng.uniform(40 * 60, 120 * 60))
        return max(dur, load + float(rng.uniform(h, 6 * h))), 0, {"load_time": load,
                                                                  "mem_mib": float(rng.uniform(2048, 5120))}
    if beh in ("finished", "crashed"):
        train = float(rng.uniform(h, 4 * h)) if beh == "finished" else float(rng.uniform(0.5 * h, 4 * h))
        extra: dict[str, Any] = {"busy_first": train}
        if beh == "finished":
            extra["mem_share"] = float(rng.uniform(0.42, 0.48))
        else:
            extra["failure"] = "oom" if rng.random() < 0.7 else "nccl"
        if rng.random() < 0.4:  # nobody looks: the allocation is held until the time limit
            limit = math.ceil((train + float(rng.uniform(h, 10 * h))) / h) * h
            extra["time_limit"] = limit
            return limit, 0, extra
        return train + float(rng.uniform(0.5 * h, 8 * h)), 0, extra
    if beh == "interactive":
        return float(rng.uniform(2 * h, 8 * h)), 1, {
            "partition": "interactive", "name": INTERACTIVE_NAMES[int(rng.integers(len(INTERACTIVE_NAMES)))],
            "batch": False, "burst_every": 20 * 60.0, "gap_max": 90 * 60.0, "burst_min": 60.0, "burst_length": 300.0,
            "mem_mib": float(rng.uniform(1024, 8192)), "rseed": int(rng.integers(2**31)), "time_limit": 8 * h,
        }
    raise ScenarioError(f"{beh!r} is not a generated hard behaviour")


def _service_fleet(nodes: Sequence[SimNode], rng: np.random.Generator,
                   horizon: float) -> tuple[list[SimJob], dict[str, int]]:
    """Return the service endpoints of a hard cluster and how many GPUs each node gives them.

    About one endpoint per node (at least 6), 1 GPU (a quarter of them 2), round robin over the
    nodes, at most half of a node's GPUs; each started days before ``-horizon``, running past 0.
    A third wake about once a day (gaps of 20-28 h), the others every 2-12 h.
    """
    want = max(6, len(nodes))
    used = {n.name: 0 for n in nodes}
    cap = {n.name: n.gpus // 2 for n in nodes}
    out: list[SimJob] = []
    i = 0
    while len(out) < want and any(used[n.name] < cap[n.name] for n in nodes):
        node = nodes[i % len(nodes)]
        i += 1
        size = 2 if rng.random() < 0.25 else 1
        spare = sum(cap.values()) - sum(used.values()) - (want - len(out))  # GPUs beyond one per endpoint left
        if used[node.name] + size > cap[node.name] or size - 1 > spare:
            size = 1
            if used[node.name] + size > cap[node.name]:
                continue
        top = node.gpus - used[node.name]
        gpus = tuple(range(top - size, top))
        used[node.name] += size
        k = len(out)
        base = SERVICE_NAMES[k % len(SERVICE_NAMES)]
        name = f"{base}-{int(rng.integers(16**6)):06x}" if rng.random() < 0.5 else f"{base}-{int(rng.integers(1, 40))}"
        daily = k % 3 == 1
        out.append(SimJob(
            job_id=str(90001 + k), user=SERVICE_USERS[k % 2], behaviour="service", node=node.name,
            gpus=gpus, start=-horizon - float(rng.uniform(86400, 14 * 86400)), end=None, account=SERVICE_ACCOUNT,
            name=name, time_limit=30 * 86400.0,
            burst_every=(20 if daily else 2) * 3600.0, gap_max=(28 if daily else 12) * 3600.0,
            burst_min=180.0, burst_length=900.0, mem_share=float(rng.uniform(0.55, 0.65)),
            rseed=int(rng.integers(2**31)),
        ))
    return out, {k: v for k, v in used.items() if v}


#: replica sets of a serving fleet: stems that no inference name glob of the shipped policy matches, owners
FLEET_STEMS = ("chat-api", "qwen-pod", "llm-pool", "assistant-gen", "rag-answerer", "summarize-api", "code-assist",
               "mixtral-chat")
FLEET_OWNERS = ("llmops", "svc-chat", "platform-ai")
FLEET_RESEARCHERS = ("ann", "bob", "cho", "dev")
#: the alphabet of Kubernetes' generated names (no vowels, no 0, 1, 3)
_K8S = "bcdfghjklmnpqrstvwxz2456789"


def serving_fleet(*, nodes: int = 18, gpus_per_node: int = 8, days: float = 1.0, seed: int = 0,
                  sample_interval: float = 60.0, model: str = "h100", anchor: float | None = None) -> Scenario:
    """Return a production LLM serving cluster observed over ``[-days, 0]``: replica sets of one model
    each, one GPU a pod, and the waste that is still there to find.

    Drawn per seed, the space the real fleets span:

    * 1-3 replica sets, each one owner and one name stem (``chat-api-3``, ``chat-api-7f9c2``,
      ``chat-api-5d8f7c9b4-x2k4p``: StatefulSet, hashed or Deployment names), one model each: the same
      resident memory on every pod (8-60 % of the framebuffer);
    * the set busy (util > 1 %) 20-60 % of the time: a trickle of short requests (1-5 min at 3-60 %),
      each pod its own share of the load (load balancing is not fair), and 1-3 peaks a day (20-60
      min) in which every replica fed is busy;
    * a few replicas per set starved: no request for 60-95 % of their life, then served;
    * a one-day deployment: most pods start in the first hour, some later (scale-ups), no history before;
    * waste: pods that never computed (a CUDA context held, no activity, alive 30 min to 6 h),
      finished training jobs whose process lingers (memory held, its job over) for 1-4 h, and a
      few training jobs.

    The pods write no Slurm log (a serving platform keeps its own): the agent reads none.
    """
    if days < 0.25 or nodes < 1 or gpus_per_node < 1:
        raise ScenarioError(f"a serving fleet needs at least 6 hours and a GPU (days={days:g}, nodes={nodes}, "
                            f"gpus_per_node={gpus_per_node})")
    rng = np.random.default_rng([seed, 0x5E4F1EE7])
    sim_nodes = tuple(SimNode(name=f"s{i:04d}", gpus=gpus_per_node, model=model) for i in range(nodes))
    slots = [(n.name, g) for n in sim_nodes for g in range(n.gpus)]
    horizon = days * 86400.0
    t0 = -horizon
    jobs: list[SimJob] = []
    jid = 400000

    def take() -> tuple[str, int] | None:
        return slots.pop(0) if slots else None

    # a few training jobs (busy throughout) and finished ones whose process lingers
    for _ in range(int(rng.integers(1, 3))):
        slot = take()
        if slot is None:
            break
        jid += 1
        start = t0 - float(rng.uniform(0, 6 * 3600))
        jobs.append(SimJob(job_id=str(jid), user=FLEET_RESEARCHERS[int(rng.integers(len(FLEET_RESEARCHERS)))],
                           behaviour="training", node=slot[0], gpus=(slot[1],), start=start, end=None,
                           account="research", name=f"pretrain-{jid}", time_limit=7 * 86400.0))
    for _ in range(int(rng.integers(2, 5))):
        slot = take()
        if slot is None:
            break
        jid += 1
        start = t0 + float(rng.uniform(0, max(3600.0, horizon - 8 * 3600)))
        end = start + float(rng.uniform(3600, 4 * 3600))
        jobs.append(SimJob(job_id=str(jid), user=FLEET_RESEARCHERS[int(rng.integers(len(FLEET_RESEARCHERS)))],
                           behaviour="zombie", node=slot[0], gpus=(slot[1],), start=start, end=end,
                           linger=float(rng.uniform(3600, 4 * 3600)), account="research", name=f"finetune-{jid}",
                           time_limit=86400.0))
    n_sets = int(rng.integers(1, 4))
    n_never = int(rng.integers(2, 5))
    left = len(slots) - n_never
    if left < 2 * n_sets:
        n_sets = max(1, left // 2)
    stems = rng.permutation(len(FLEET_STEMS))[:n_sets]
    # every set at least two replicas (a set of one is no set): one each, the rest split at random
    sizes = [x + 1 for x in _split(left - n_sets, n_sets, rng)] if n_sets > 1 else [max(left, 2)]
    for k, size in enumerate(sizes):
        stem = FLEET_STEMS[int(stems[k])]
        owner = FLEET_OWNERS[k % len(FLEET_OWNERS)]
        style = int(rng.integers(3))
        rs_hash = "".join(_K8S[int(i)] for i in rng.integers(len(_K8S), size=9))
        mem_share = float(rng.uniform(0.08, 0.6))
        busy = float(rng.uniform(0.2, 0.6))
        peaks = tuple(sorted((a, a + float(rng.uniform(1200, 3600)))
                             for a in rng.uniform(t0 + 2 * 3600, -3600, size=int(rng.integers(1, 4)))))
        starved = set(rng.permutation(size)[:int(rng.integers(1, 4))].tolist()) if size >= 4 else set()
        for i in range(size):
            slot = take()
            if slot is None:
                break
            jid += 1
            late = rng.random() < 0.15
            start = t0 + (float(rng.uniform(2 * 3600, horizon - 2 * 3600)) if late else float(rng.uniform(0, 3600)))
            name = (f"{stem}-{i}" if style == 0 else
                    f"{stem}-{_hex5(rng)}" if style == 1 else
                    f"{stem}-{rs_hash}-{''.join(_K8S[int(c)] for c in rng.integers(len(_K8S), size=5))}")
            share = float(np.clip(busy * rng.lognormal(0.0, 0.3), 0.05, 0.75))
            length = float(rng.uniform(120, 300))  # a burst lasts 1 min to this long
            mean = (60.0 + length) / 2
            # a burst of L seconds shows in about L/60 + 1/2 one-minute samples: the gap that gives the share
            quiet = float(rng.uniform(0.6, 0.95)) * (-start) if i in starved else 0.0
            jobs.append(SimJob(
                job_id=str(jid), user=owner, behaviour="replica", node=slot[0], gpus=(slot[1],), start=start,
                end=None, account="llm-platform", name=name, time_limit=30 * 86400.0, mem_share=mem_share,
                burst_min=60.0, burst_length=length, burst_every=max(60.0, (mean + 30.0) / share - mean),
                quiet_until=quiet, peaks=tuple(p for p in peaks if p[0] >= start + quiet),
                rseed=int(rng.integers(2**31)),
            ))
        # pods of the set that never computed: a CUDA context, no request ever
        for _ in range(n_never if k == 0 else 0):
            slot = take()
            if slot is None:
                break
            jid += 1
            start = t0 + float(rng.uniform(0, horizon - 1800))
            end = start + float(rng.uniform(1800, 6 * 3600))
            jobs.append(SimJob(job_id=str(jid), user=owner, behaviour="never_active", node=slot[0], gpus=(slot[1],),
                               start=start, end=end if end < 0 else None, account="llm-platform",
                               name=f"{stem}-{_hex5(rng)}", time_limit=30 * 86400.0,
                               mem_mib=float(rng.uniform(300, 900))))
    index = {n.name: i for i, n in enumerate(sim_nodes)}
    pinned: float | str = float(anchor) if anchor is not None else "now"
    return Scenario(sim_nodes, tuple(jobs), seed, sample_interval, pinned, "<serving-fleet>", index)


def _hex5(rng: np.random.Generator) -> str:
    """Return a five-digit hex hash with a digit in it (one of letters only reads as a word: ``decaf``)."""
    text = f"{int(rng.integers(16 ** 5)):05x}"
    return text if any(c.isdigit() for c in text) else text[:4] + str(int(rng.integers(10)))


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
    #: per row, the MIG columns (:data:`gpu_cost.core.model.MIG_COLUMNS`); None when no row is a slice
    mig: Mapping[str, np.ndarray] | None = None


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
        migs: list[str] = []
        profiles: list[str] = []
        mig_uuids: list[str] = []
        shares: list[float] = []
        self._row: dict[tuple[str, int | str], int] = {}
        for node in scenario.nodes:
            for g in range(node.gpus):
                # a MIG GPU is its slices: one row each, keyed (node, "<gpu>/<gi>")
                parts = [(str(k + 1), p) for k, p in enumerate(node.slices(g))] or [("", "")]
                for gi, profile in parts:
                    share = mig_share(profile, node.mem_total_mib / 1024.0) if gi else 1.0
                    self._row[(node.name, f"{g}/{gi}" if gi else g)] = len(hosts)
                    hosts.append(node.name)
                    gpus.append(g)
                    uuids.append(gpu_uuid(node.name, g))
                    models.append(node.model)
                    totals.append(_profile_mib(profile) if gi else node.mem_total_mib)
                    idle_w.append(node.idle_power_w * share)
                    busy_w.append(node.busy_power_w * share)
                    migs.append(gi)
                    profiles.append(profile)
                    mig_uuids.append(mig_uuid(node.name, g, gi) if gi else "")
                    shares.append(share)
        self.hosts = np.array(hosts, dtype=object)
        self.gpu_idx = np.array(gpus, dtype=np.int64)
        self.uuids = np.array(uuids, dtype=object)
        self.models = np.array(models, dtype=object)
        self.mem_total = np.array(totals, dtype=float)
        self.idle_w = np.array(idle_w, dtype=float)
        self.busy_w = np.array(busy_w, dtype=float)
        self.mig: dict[str, np.ndarray] | None = None
        if any(migs):
            self.mig = {"mig": np.array(migs, dtype=object), "mig_profile": np.array(profiles, dtype=object),
                        "mig_uuid": np.array(mig_uuids, dtype=object), "share": np.array(shares, dtype=float)}
        self._jobs = [j for j in scenario.jobs]
        self._by_id = {j.job_id: j for j in self._jobs}

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
    def matrix(self, start: float, end: float, hosts: Collection[str] | None = None) -> GpuMatrix:
        """Return dense samples for every GPU in ``(start, end]`` (only those of ``hosts`` when given).

        A GPU's samples are the same whichever others are asked for with it (a shard of the sweep
        sees what the whole cluster's matrix holds for its nodes).
        """
        times = self.sample_times(start, end).astype(float)
        keep = np.arange(len(self.hosts)) if hosts is None else np.flatnonzero(np.isin(self.hosts, list(hosts)))
        local = None if hosts is None else {int(r): i for i, r in enumerate(keep)}
        n_g, n_t = len(keep), len(times)
        t_idx = np.round(times / self.scenario.sample_interval).astype(np.int64)
        noise = _noise(self.scenario.seed, keep, t_idx)
        mem_total, idle_w, busy_w = self.mem_total[keep], self.idle_w[keep], self.busy_w[keep]
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
            rows = self.job_rows(j)  # the whole cluster's rows
            tt = times[lo:hi]
            tau = tt - s
            if local is None:
                nz = noise[rows][:, lo:hi]
            else:
                mine = np.array([int(r) in local for r in rows], dtype=bool)
                if not mine.any():
                    continue  # a job on nodes not asked for
                if mine.all():
                    nz = noise[[local[int(r)] for r in rows]][:, lo:hi]
                else:  # a job across groups: its own rows' noise, so each GPU's samples stay the same
                    nz = _noise(self.scenario.seed, rows, t_idx)[:, lo:hi]
            total = self.mem_total[rows][:, None]
            u, m = _behaviour(j, tau, nz, total, e - s)
            if j.idle_gpus:
                u[len(rows) - min(j.idle_gpus, len(rows)):] = 0.0  # idle ranks: memory held, nothing computed
            if local is not None:
                u, m = u[mine], m[mine]
                rows = np.array([local[int(r)] for r in rows[mine]], dtype=np.int64)
            if j.shared:
                # several jobs on one device: their work and memory add up
                util[rows, lo:hi] += u
                mem[rows, lo:hi] += m
            else:
                util[rows, lo:hi] = u
                mem[rows, lo:hi] = m
            active[rows, lo:hi] = True
            in_job = tt < e
            if in_job.any() and not j.shared:  # a shared device's job label names no single job
                block = job[rows, lo:hi]
                block[:, in_job] = j.job_id
                job[rows, lo:hi] = block
        util = np.clip(util, 0, 100)
        mem = np.clip(mem, 0, mem_total[:, None])
        power = idle_w[:, None] + (busy_w - idle_w)[:, None] * (util / 100.0)
        # idle, empty GPUs still report (DCGM samples every GPU); a little noise on memory for realism
        mem = np.where(active, mem, 0.0)
        mig = None if self.mig is None else {k: v[keep] for k, v in self.mig.items()}
        return GpuMatrix(times, self.hosts[keep], self.gpu_idx[keep], self.uuids[keep], self.models[keep], mem_total,
                         util, mem, power, job, mig)

    def job_rows(self, j: SimJob) -> np.ndarray:
        """Return the rows of a job's devices: its GPUs (first node, then ``also``), then its MIG slices."""
        keys: list[tuple[str, int | str]] = [(str(j.node), g) for g in j.gpus]
        keys += [(h, g) for h, gs in j.also for g in gs]
        keys += [(str(j.node), sl) for sl in j.mig]
        return np.array([self._row[k] for k in keys], dtype=np.int64)

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
        alloc: tuple[tuple[str, tuple[int, ...]], ...] = ()
        mig: tuple[tuple[str, tuple[str, ...]], ...] = ()
        if state != "PENDING" and j.node:
            # Slurm counts a MIG slice as one GPU of the node: its index says nothing of the slice
            first = j.gpus + tuple(int(sl.split("/")[0]) for sl in j.mig)
            alloc = ((j.node, first), *j.also)
            mig = ((j.node, j.mig),) if j.mig else ()
        n_dev = len(j.gpus) + len(j.mig) + sum(len(g) for _, g in j.also)
        return Job(
            job_id=j.job_id, user=j.user, state=state, start_ts=start_ts, account=j.account, partition=j.partition,
            qos=j.qos, name=j.name or f"job-{j.job_id}", comment=j.comment, submit_ts=submit, end_ts=end_ts,
            time_limit_s=j.time_limit, nodes=tuple(h for h, _ in alloc), gpu_alloc=alloc,
            gpus_requested=j.gpus_requested or n_dev, labels=labels_from_comment(j.comment),
            batch=j.is_batch, mig_alloc=mig, gpu_shared=j.shared,
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
                    "time_limit_s": j.time_limit, "gpus": len(j.gpus) + len(j.mig) + sum(len(g) for _, g in j.also),
                    "nodes": ",".join([str(j.node), *(h for h, _ in j.also)]),
                    "gpu_ids": ",".join([*(f"{j.node}:{g}" for g in j.gpus), *(f"{h}:{g}" for h, gs in j.also for g in gs),
                                         *(f"{j.node}:{sl.replace('/', '/mig')}" for sl in j.mig)]), "labels": ",".join(labels_from_comment(j.comment)),
                    "behaviour": j.behaviour, "batch": j.is_batch,
                }
            )
        return pd.DataFrame(rows)

    def processes_at(self, t: float, hosts: Collection[str] | None = None) -> list[GpuProcess]:
        """Return GPU processes as ``nvidia-smi`` plus ``/proc`` would show them at ``t`` (on ``hosts`` when given)."""
        m = self.matrix(t - self.scenario.sample_interval, t, hosts)
        # the cluster's row → the row of ``m`` (which holds only the GPUs of ``hosts`` when given)
        local = None if hosts is None else {
            int(r): i for i, r in enumerate(np.flatnonzero(np.isin(self.hosts, list(hosts))))}
        out = []
        sharers: dict[int, int] = {}
        for j in self._jobs:
            if j.shared and not j.pending and j.start is not None and self.anchor + j.start <= t and (
                    j.end is None or self.anchor + j.end > t):
                for row in self.job_rows(j):
                    sharers[int(row)] = sharers.get(int(row), 0) + 1
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
            if j.behaviour in ("idle", "crashed") and t - s > j.busy_first:
                continue  # the training process exited (or died); the allocation sits empty
            pid = sim_pid(j.job_id)
            for row in self.job_rows(j):
                if local is not None and int(row) not in local:
                    continue  # a GPU on a node not asked for
                host, g = str(self.hosts[row]), int(self.gpu_idx[row])
                gi = str(self.mig["mig"][row]) if self.mig is not None else ""
                at = int(row) if local is None else local[int(row)]
                used = float(m.mem[at, -1]) if m.mem.shape[1] else 0.0
                if j.shared:
                    used /= max(1, sharers.get(int(row), 1))  # the device's memory is the sum of its jobs'
                uuid = str(self.mig["mig_uuid"][row]) if gi and self.mig is not None else self.uuids[row]
                out.append(
                    GpuProcess(
                        host=host, pid=pid, gpu_uuid=uuid, gpu=g, used_mib=round(used, 1),
                        start_ts=float(int(s)), job_id=None if zombie_tail and not j.keeps_job_id else j.job_id, user=j.user,
                        name="python", mig=gi,
                        mig_profile=str(self.mig["mig_profile"][row]) if gi and self.mig is not None else "",
                    )
                )
        return out

    # -- logs ------------------------------------------------------------------------------
    def log_lines(self, start: float, end: float) -> pd.DataFrame:
        """Return the lines the jobs wrote to their logs in ``(start, end]``: ``ts, job_id, stream, line``.

        In time order (a job's lines in the order written); deterministic for the scenario.
        """
        rows: list[tuple[int, str, str, str]] = []
        for j in self._jobs:
            if j.pending or j.start is None:
                continue
            s = self.anchor + j.start
            e = math.inf if j.end is None else self.anchor + j.end
            if s > end or e <= start:
                continue
            rows.extend((ts, j.job_id, stream, line) for ts, stream, line in job_log_lines(j, s, e, start, end))
        frame = pd.DataFrame(rows, columns=["ts", "job_id", "stream", "line"])
        frame["ts"] = frame["ts"].astype(np.int64)
        return frame.sort_values("ts", kind="stable").reset_index(drop=True)

    def job_log(self, job_id: str, now: float, max_bytes: int) -> dict[str, Any] | None:
        """Return a job's log as the node wrapper's ``job-log`` verb reads it at ``now``: ``path``,
        ``text`` (the tail, at most ``max_bytes``), ``size`` (bytes written so far) and ``mtime``."""
        from gpu_cost.analyse.evidence import tail_lines

        j = self._by_id.get(job_id)
        if j is None or j.pending or j.start is None:
            return None
        s = self.anchor + j.start
        e = math.inf if j.end is None else self.anchor + j.end
        lines = job_log_lines(j, s, e, -math.inf, now)
        text = [line for _, _, line in lines]
        out: dict[str, Any] = {
            "path": f"/home/{j.user}/slurm-{j.job_id}.out", "text": tail_lines(text, max_bytes),
            "size": sum(len(line.encode("utf-8")) + 1 for line in text),
            "mtime": float(lines[-1][0]) if lines else None,
        }
        if j.behaviour == "dataloader" and s <= now < e:
            # what the wrapper samples of the job's processes: its data-loader workers keep the CPUs and
            # the storage busy while the GPUs wait for the next batch (other behaviours: not simulated)
            out.update(cpu_cores=DATALOADER_CORES_PER_GPU * max(1, len(j.gpus)), io_bps=DATALOADER_IO_BPS)
        return out

    def reservations_at(self, t: float) -> list[Reservation]:
        """Return the reservations as ``scontrol show reservation`` lists them at ``t`` (not those ended)."""
        out = []
        for r in self.scenario.reservations:
            start, end = self.anchor + r.start, self.anchor + r.end
            if end <= t:
                continue
            out.append(Reservation(name=r.name, start_ts=start, end_ts=end, nodes=r.nodes, node_count=len(r.nodes),
                                   state="ACTIVE" if start <= t else "INACTIVE", accounts=r.accounts, users=r.users,
                                   partition=r.partition, flags=r.flags))
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
    if j.behaviour == "service":
        burst = _in_bursts(j, tau2)
        util = np.where(burst, 40 + 50 * noise, 0.5 * noise)
        mem = np.broadcast_to(total * (0.6 if j.mem_share is None else j.mem_share), shape) + 30 * noise
        return util, mem
    if j.behaviour == "checkpoint":
        pause = _in_pause(j, tau2)
        util = np.where(pause, 2 * noise, 85 + 13 * noise)
        return util, np.broadcast_to(total * 0.85, shape) + 200 * noise
    if j.behaviour == "dataload":
        loading = tau2 < j.load_time
        util = np.where(loading, 2 * noise, 85 + 13 * noise)
        mem = np.where(loading, 3072.0 if j.mem_mib is None else j.mem_mib, total * 0.85) + 100 * noise
        return util, mem
    if j.behaviour == "finished":
        busy = tau2 < j.busy_first
        held = total * (0.45 if j.mem_share is None else j.mem_share)
        return np.where(busy, 85 + 13 * noise, 0.0), np.where(busy, total * 0.85 + 200 * noise, held + 20 * noise)
    if j.behaviour == "crashed":
        busy = tau2 < j.busy_first
        return np.where(busy, 85 + 13 * noise, 0.0), np.where(busy, total * 0.85 + 200 * noise, 0.0)
    if j.behaviour == "replica":
        # requests: a trickle of short bursts (3-60 %), busy throughout the set's peaks; idle under 1 %
        burst = _in_bursts(j, tau2)
        peak = np.zeros(shape, dtype=bool)
        for a, b in j.peaks:
            peak |= (tau2 >= a - (j.start or 0.0)) & (tau2 < b - (j.start or 0.0))
        util = np.where(peak, 50 + 45 * noise, np.where(burst, 3 + 57 * noise, 0.8 * noise))
        mem = np.broadcast_to(total * (0.2 if j.mem_share is None else j.mem_share), shape) + 30 * noise
        return util, mem
    if j.behaviour == "never_active":
        # a pod that never got to work: its server holds a CUDA context, computes nothing
        context = np.full_like(total, 512.0 if j.mem_mib is None else j.mem_mib)
        return 0.8 * noise, np.broadcast_to(context, shape) + 20 * noise
    if j.behaviour == "interactive":
        burst = _in_bursts(j, tau2)
        util = np.where(burst, 20 + 60 * noise, 0.0)
        mem = np.broadcast_to(np.full_like(total, 4096.0 if j.mem_mib is None else j.mem_mib), shape) + 50 * noise
        return util, mem
    raise ScenarioError(f"unknown behaviour {j.behaviour!r}")


@functools.lru_cache(maxsize=8192)
def _burst_schedule(j: SimJob, upto: float) -> tuple[np.ndarray, np.ndarray]:
    """Return (starts, ends) of the bursts of a service or a session, job-relative, starting before ``upto``.

    The gaps and lengths come from the job's own seed, drawn one burst at a time, so the
    schedule's prefix is the same whatever ``upto`` (any range sees the same bursts).
    """
    rng = np.random.default_rng([j.rseed & 0xFFFFFFFF, zlib.crc32(j.job_id.encode())])
    lo_gap = max(1.0, j.burst_every)
    hi_gap = max(lo_gap, j.gap_max if j.gap_max is not None else lo_gap)
    hi_len = max(1.0, j.burst_length)
    lo_len = min(hi_len, j.burst_min if j.burst_min is not None else hi_len)
    starts: list[float] = []
    ends: list[float] = []
    replica = j.behaviour == "replica"  # requests arrive at random: exponential gaps of mean burst_every
    t = j.quiet_until + (float(rng.exponential(lo_gap)) if replica else float(rng.uniform(0, lo_gap)))
    while t < upto:
        length = float(rng.uniform(lo_len, hi_len))
        starts.append(t)
        ends.append(t + length)
        t += length + (float(rng.exponential(lo_gap)) if replica else float(rng.uniform(lo_gap, hi_gap)))
    return np.array(starts), np.array(ends)


def _bursts(j: SimJob, upto: float) -> tuple[np.ndarray, np.ndarray]:
    # a cache key per week: a long replay asks again and again for the same job
    week = 7 * 86400.0
    return _burst_schedule(j, (math.floor(max(upto, 0.0) / week) + 1) * week)


def _in_bursts(j: SimJob, tau: np.ndarray) -> np.ndarray:
    if not tau.size:
        return np.zeros(tau.shape, dtype=bool)
    starts, ends = _bursts(j, float(np.max(tau)))
    if not starts.size:
        return np.zeros(tau.shape, dtype=bool)
    k = np.searchsorted(starts, tau, side="right") - 1
    return (k >= 0) & (tau < ends[np.clip(k, 0, None)])


def _in_pause(j: SimJob, tau: np.ndarray) -> np.ndarray:
    """A checkpointing job pauses at every multiple of ``burst_every`` for ``burst_length``."""
    period = max(60.0, j.burst_every)
    return (tau >= period) & (np.mod(tau, period) < j.burst_length)


def job_log_lines(j: SimJob, s: float, e: float, lo: float, hi: float) -> list[tuple[int, str, str]]:
    """Return ``(ts, stream, line)`` of what job ``j`` (running over ``[s, e)``, absolute) wrote in ``(lo, hi]``.

    Training writes a progress line every :data:`PROGRESS_EVERY`; the phases of the hard
    behaviours write theirs (checkpoints, data loading, the finish, the traceback of a crash);
    services an access line a minute while a burst lasts; idle jobs and sessions nothing after
    their start. A line is written while the job runs (``ts < e``).
    """
    out: list[tuple[int, str, str]] = []
    hi = min(hi, e - 1e-9)
    lo = max(lo, s - 1.0)  # nothing before the start (and no infinite bounds below)
    if hi <= lo or not math.isfinite(hi) or j.behaviour in FLEET_BEHAVIOURS:
        return out  # a serving fleet's pods log to their platform, not to a Slurm StdOut the agent reads
    seed = zlib.crc32(j.job_id.encode())
    name = j.name or f"job-{j.job_id}"
    beh = j.behaviour

    def put(tau: float, line: str, stream: str = "stdout") -> None:
        ts = math.floor(s + tau)
        if lo < ts <= hi and s + tau < e:
            out.append((ts, stream, line))

    def train(t0: float, t1: float, skip: Any = None) -> None:
        """Progress lines at ``t0 + k * PROGRESS_EVERY`` (k ≥ 1) before ``t1`` (job-relative)."""
        t1 = min(t1, hi - s + 1, e - s)
        k0 = max(1, math.ceil((lo - s - t0 - 1) / PROGRESS_EVERY))
        k1 = math.floor((t1 - t0) / PROGRESS_EVERY)
        for k in range(k0, k1 + 1):
            tau = t0 + k * PROGRESS_EVERY
            if tau >= t1 or (skip is not None and skip(tau)):
                continue
            put(tau, _progress_line(seed, k))

    if beh != "interactive" or name.startswith("jupyter"):
        put(0.0, _start_line(j, name))
    if beh in ("training", "dataloader", "memleak"):
        train(0.0, math.inf)
    elif beh == "zombie":
        train(0.0, math.inf)
        if math.isfinite(e) and e - s > 60:
            put(e - s - 30, "Training finished after " + _progress_line(seed, int((e - s) // PROGRESS_EVERY)))
    elif beh == "checkpoint":
        period = max(60.0, j.burst_every)
        train(0.0, math.inf, skip=lambda tau: tau >= period and tau % period < j.burst_length)
        k0 = max(1, math.floor((lo - s - j.burst_length) / period))
        k1 = math.floor((min(hi, e) - s) / period)
        for k in range(k0, k1 + 1):
            t0 = k * period
            step = _step(seed, int(t0 // PROGRESS_EVERY))
            n = max(2, int(j.burst_length // 90))
            put(t0, f"saving checkpoint step {step} to /scratch/{j.user}/{name}/ckpt-{step}")
            for i in range(1, n + 1):
                put(t0 + i * j.burst_length / (n + 1), f"writing shard {i}/{n} of checkpoint step {step}")
            put(t0 + j.burst_length - 5, f"checkpoint step {step} written ({n} shards), resuming")
    elif beh == "dataload":
        n = max(1, int(j.load_time // 60))
        i0 = max(1, math.floor((lo - s) / 60))
        i1 = min(n, math.floor((hi - s) / 60) + 1)
        for i in range(i0, i1 + 1):
            put(60.0 * i, f"loading shard {i}/{n} from /datasets/{name}/train-{i:05d}.tar")
        put(j.load_time, f"dataset ready: {n} shards, starting training")
        train(j.load_time, math.inf)
    elif beh == "finished":
        train(0.0, j.busy_first)
        k = int(j.busy_first // PROGRESS_EVERY)
        put(j.busy_first, f"Training finished: {_progress_line(seed, k)}")
        put(j.busy_first + 15, f"saved final checkpoint to /scratch/{j.user}/{name}/final.pt")
    elif beh == "crashed":
        train(0.0, j.busy_first)
        for line in _traceback(j, name, seed):
            put(j.busy_first, line, "stderr")
    elif beh in ("service", "inference"):
        if beh == "service":
            starts, ends = _bursts(j, min(hi, e) - s)
        else:
            every = max(60.0, j.burst_every)
            ks = np.arange(max(0, math.floor((lo - s) / every) - 1), math.floor((min(hi, e) - s) / every) + 1)
            starts, ends = ks * every, ks * every + j.burst_length
        first = int(np.searchsorted(ends, lo - s, side="left"))
        for b0, b1 in zip(starts[first:], ends[first:], strict=True):
            if s + b0 > hi:
                break
            for i in range(math.ceil((b1 - b0) / 60)):
                r = (seed + int(b0) * 31 + i * 7919) % 100000
                put(b0 + 60 * i, f"POST /v1/completions 200 {120 + r % 900}ms tokens={16 + r % 480} "
                                 f"rps={1 + r % 40}")
    out.sort(key=lambda x: x[0])  # stable: lines written in the same second keep their order
    return out


def _step(seed: int, k: int) -> int:
    return k * (40 + seed % 160)


def _progress_line(seed: int, k: int) -> str:
    step = _step(seed, k)
    epoch = step // ((40 + seed % 160) * 24 * (1 + seed % 4))
    loss = 0.3 + 2.2 * math.exp(-k / 150.0) + ((k * 2654435761 + seed) % 1000) / 100000.0
    return f"epoch {epoch} step {step} loss {loss:.4f}"


def _start_line(j: SimJob, name: str) -> str:
    if j.behaviour in ("service", "inference"):
        return f"INFO: model loaded for {name}; listening on 0.0.0.0:8000"
    if j.behaviour == "interactive":
        return f"[I ServerApp] Jupyter Server is running at: http://{j.node}:8888/lab"
    return f"starting {name} on {j.node} with {len(j.gpus)} GPU(s)"


def _traceback(j: SimJob, name: str, seed: int) -> list[str]:
    head = [
        "Traceback (most recent call last):",
        f'  File "/home/{j.user}/{name}/train.py", line {180 + seed % 90}, in <module>',
        "    main()",
        f'  File "/home/{j.user}/{name}/train.py", line {120 + seed % 50}, in main',
    ]
    if j.failure == "nccl":
        return [
            "[rank0]:[E ProcessGroupNCCL.cpp:616] [Rank 0] Watchdog caught collective operation timeout: "
            f"WorkNCCL(SeqNum={seed % 100000}, OpType=ALLREDUCE, NumelIn=1048576, Timeout(ms)=600000) "
            "ran for 600127 milliseconds before timing out.",
            *head, "    loss.backward()",
            "torch.distributed.DistBackendError: NCCL watchdog timeout: collective operation ALLREDUCE timed out",
        ]
    return [
        *head, "    outputs = model(**batch)",
        "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity "
        "of 79.15 GiB of which 1.06 GiB is free. Of the allocated memory 75.31 GiB is allocated by PyTorch.",
    ]


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


def mig_uuid(host: str, index: int, gi: str) -> str:
    """Return a stable MIG device UUID (``MIG-...``, as ``nvidia-smi -L`` prints it) for a simulated slice."""
    return "MIG-" + str(_uuid.uuid5(_uuid.NAMESPACE_DNS, f"{host}.gpu{index}.mig{gi}.gpu-cost.sim"))


def _profile_mib(profile: str) -> float:
    """Return a MIG profile's framebuffer (MiB): ``1g.10gb`` → 10240."""
    return float(profile.split(".")[1].split("gb")[0]) * 1024.0


def snapshot(policy: Any, now: float, scenario: Scenario | None = None, shard: tuple[int, int] | None = None) -> Any:
    """Return what the agent would see of the simulated cluster at ``now``.

    :param shard: ``(index, count)``: only what that node group of the sweep sees
        (:func:`gpu_cost.perceive.shards.select`); its GPUs are simulated alone, the others not at all.
    """
    from gpu_cost.perceive import shards
    from gpu_cost.perceive.live import log_candidates
    from gpu_cost.perceive.snapshot import from_matrix

    sc = scenario or load_scenario()
    cluster = SimCluster(sc, anchor=now)
    jobs, nodes = cluster.jobs_at(now), cluster.nodes_at(now)
    resv = cluster.reservations_at(now) if policy.rules.idle_reservation.enabled else []
    sel = None
    if shard is not None and shard[1] > 1:
        sel = shards.select([n.name for n in nodes], jobs, resv, *shard)
        resv = [r for r in resv if r.name in sel.owned_reservations]
        procs = cluster.processes_at(now, sel.hosts)
        sel = shards.widen(sel, (p.job_id for p in procs if p.job_id))
        jobs = [j for j in jobs if j.job_id in sel.jobs]
        nodes = [n for n in nodes if n.name in sel.hosts]
    else:
        procs = cluster.processes_at(now)
    m = cluster.matrix(now - policy.sweep.lookback, now, None if sel is None else sel.hosts)
    snap = from_matrix(
        policy=policy, now=now, source="sim", hosts=m.hosts, gpus=m.gpus, uuids=m.uuids, models=m.models,
        mem_total=m.mem_total, times=m.times, util=m.util, mem=m.mem, power=m.power, job=m.job,
        jobs=jobs, processes=procs, nodes=nodes, mig=m.mig,
    )
    snap.reservations = tuple(resv)
    # the node wrapper's job-log verb: the log tails of the jobs a rule may find idle (a shard: of the
    # jobs it judges; the run keeps the cluster's first ``max_jobs_per_sweep``, gpu_cost.perceive.shards.merge)
    max_bytes = policy.evidence.job_log.max_bytes
    judged = snap if sel is None else dataclasses.replace(snap, jobs=tuple(
        j for j in snap.jobs if not j.running or j.job_id in sel.owned_jobs))
    for job in log_candidates(judged, policy):
        log = cluster.job_log(job.job_id, now, max_bytes)
        if log is not None:
            snap.job_logs[job.job_id] = log
    return snap


def sim_jobs(now: float, days: float, *, nodes: int = 16, seed: int = 0, with_scenario: bool = False) -> pd.DataFrame:
    """Return the simulator's job trace over the ``days`` before ``now`` (fast, deterministic).

    The history is a generated ``nodes``-node cluster; with ``with_scenario`` the jobs of the
    simulated cluster the sweep observes (the shipped or ``GPU_COST_SCENARIO`` scenario, anchored at
    ``now`` as the sweep anchors it) are added, so its running jobs get end-time forecasts too.
    """
    import pandas as pd

    from gpu_cost.capacity.forecast.history import jobs_frame, normalise_jobs

    start = now - days * 86400.0
    traces = [SimCluster(generate_scenario(nodes=nodes, days=days, seed=seed), now).jobs_trace(start, now)]
    if with_scenario:
        traces.append(SimCluster(load_scenario(), now).jobs_trace(start, now))
    traces = [t for t in traces if not t.empty]
    if not traces:
        return jobs_frame([])
    trace = pd.concat(traces, ignore_index=True)
    trace = trace.assign(end_ts=trace["end_ts"].where(trace["end_ts"].notna() & (trace["end_ts"] <= now)))
    return normalise_jobs(trace, "simulator")
