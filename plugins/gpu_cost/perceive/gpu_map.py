"""Index truth: does each node number its GPUs the way the agent believes?

The agent joins three numberings of one GPU: Slurm's GRES index (``IDX`` in ``gres_detail`` and
``scontrol show node -d``'s ``GresUsed``), the NVML index (``nvidia-smi``'s ``index``, the
``gpu`` label of the DCGM exporter, the snapshot's ``gpu`` column) and the UUID. It takes Slurm's
``IDX k`` to be NVML index ``k``. That holds when ``gres.conf`` lists the device files in minor
order (``File=/dev/nvidia[0-7]``, as ``AutoDetect=nvml`` does) and the driver's minor numbers
follow NVML's (PCI bus) order, which is usual but not guaranteed: a GPU replaced or rebound, a
``gres.conf`` written by hand, or ``CUDA_DEVICE_ORDER`` differences can shift it. A shifted
mapping would point an action at the wrong GPU, so this probe checks it on each node the
sweep inspects, from what the node wrapper's ``inspect`` verb reports (one SSH call, no extra):

- ``nvidia-smi --query-gpu=index,uuid,pci.bus_id --format=csv,noheader`` (the node's NVML order);
- ``/proc/driver/nvidia/gpus/<bus id>/information`` (the driver's ``Device Minor`` and
  ``GPU UUID``; absent on nodes without the NVIDIA driver's procfs: then that part is not checked);
- ``CUDA_VISIBLE_DEVICES`` of each GPU process (a list of UUIDs in containers, some Slurm setups
  and MIG, else indices relative to the job's device cgroup, which prove nothing and are skipped);

against Slurm (the node's GPU count, the jobs' ``IDX`` on the node) and the metrics (the UUID the
exporter gives each index). :func:`check_node` returns what disagrees; :func:`apply` marks every
GPU of a disagreeing node ``stale`` in the snapshot's frame and adds a problem naming the node, so
the rules find nothing there and the engine holds destructive actions back (a snapshot with
problems is degraded: nothing destructive is decided from it, a manual request is refused).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpu_cost.core.errors import SourceError

if TYPE_CHECKING:
    import pandas as pd

    from gpu_cost.core.model import GpuProcess, Job, Node

logger = logging.getLogger(__name__)

_BUS = re.compile(r"^(?:([0-9A-Fa-f]{4,8}):)?([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})\.([0-7])$")
_UUID = re.compile(r"^(GPU|MIG)-[0-9A-Za-z][0-9A-Za-z/-]{7,80}$")


@dataclass(frozen=True)
class NvmlGpu:
    """One GPU as NVML numbers it: index, UUID, PCI bus id (normalised, see :func:`bus_id`)."""

    index: int
    uuid: str
    bus_id: str


@dataclass(frozen=True)
class DriverGpu:
    """One GPU as the driver's procfs shows it: PCI bus id, device minor number, UUID."""

    bus_id: str
    minor: int | None
    uuid: str


@dataclass(frozen=True)
class MapCheck:
    """The verdict for one node: ``problems`` empty means the numberings agree."""

    host: str
    problems: tuple[str, ...] = ()
    checked: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.problems


@dataclass
class NodeMap:
    """What a node reported for the check (filled by :func:`gpu_cost.perceive.nodes.parse_inspect`)."""

    nvml: list[NvmlGpu] = field(default_factory=list)
    driver: list[DriverGpu] = field(default_factory=list)
    #: pid → CUDA_VISIBLE_DEVICES as the process's environment holds it
    visible: dict[int, str] = field(default_factory=dict)
    #: why the node's numbering could not be read (nvidia-smi failed); None when it was
    error: str | None = None
    #: False when the wrapper did not report a numbering at all (an older wrapper)
    reported: bool = True
    #: NVML index → MIG slices on that GPU (``nvidia-smi -L``); Slurm's MIG gres counts slices, not GPUs
    mig_slices: dict[int, int] = field(default_factory=dict)

    def slurm_devices(self) -> int:
        """The GPU devices Slurm would count on the node: whole GPUs, and each MIG slice as one."""
        return len(self.nvml) - sum(1 for g in self.nvml if self.mig_slices.get(g.index)) + sum(
            n for i, n in self.mig_slices.items() if i in {g.index for g in self.nvml})


# -- parsers (pure) ----------------------------------------------------------------------------
def bus_id(text: str) -> str:
    """Return a PCI bus id in the driver's form: ``00000000:3B:00.0`` → ``0000:3b:00.0``. Raises ValueError."""
    m = _BUS.match(text.strip())
    if not m:
        raise ValueError(f"{text.strip()[:40]!r} is not a PCI bus id")
    domain = (m.group(1) or "0000")[-4:]
    return f"{domain}:{m.group(2)}:{m.group(3)}.{m.group(4)}".lower()


def parse_map(text: str, host: str) -> list[NvmlGpu]:
    """Parse ``nvidia-smi --query-gpu=index,uuid,pci.bus_id --format=csv,noheader``; SourceError naming the line."""
    out: list[NvmlGpu] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 3 or not parts[0].isdigit() or not _UUID.match(parts[1]):
            raise SourceError(f"{host}: GPU numbering line {lineno} is not 'index, uuid, pci.bus_id': {line[:120]!r}")
        try:
            out.append(NvmlGpu(int(parts[0]), parts[1], bus_id(parts[2])))
        except ValueError as exc:
            raise SourceError(f"{host}: GPU numbering line {lineno}: {exc}") from None
    return out


def parse_driver_info(files: Mapping[str, str], host: str) -> list[DriverGpu]:
    """Parse the driver's ``information`` files, keyed by their directory name (the bus id).

    Each holds ``Key: value`` lines; ``Device Minor`` and ``GPU UUID`` are read (``Bus Location``
    when present overrides the directory name). A file with neither is skipped.
    """
    out: list[DriverGpu] = []
    for name, text in sorted(files.items()):
        kv: dict[str, str] = {}
        for line in str(text).splitlines():
            key, sep, value = line.partition(":")
            if sep:
                kv[key.strip().lower()] = value.strip()
        minor_text, uuid = kv.get("device minor", ""), kv.get("gpu uuid", "")
        if not minor_text and not uuid:
            continue
        try:
            where = bus_id(kv.get("bus location") or name)
        except ValueError as exc:
            raise SourceError(f"{host}: driver information {name!r}: {exc}") from None
        if minor_text and not minor_text.isdigit():
            raise SourceError(f"{host}: driver information {name!r}: Device Minor {minor_text[:20]!r} is not a number")
        out.append(DriverGpu(where, int(minor_text) if minor_text else None, uuid))
    return out


def visible_devices(value: str | None, gpus: Sequence[NvmlGpu]) -> tuple[tuple[int, ...], tuple[str, ...]] | None:
    """Map a ``CUDA_VISIBLE_DEVICES`` of UUIDs to NVML indices: ``(indices, unknown UUIDs)``.

    A full UUID or a unique prefix of one (CUDA accepts ``GPU-8c1f``) names a GPU; ``MIG-``
    entries name a slice whose parent this numbering does not list, so they are neither mapped
    nor unknown. Returns None when the value is unset, empty or holds indices (those are
    relative to the job's device cgroup: they prove nothing about the node's numbering).
    """
    if not value or not value.strip():
        return None
    items = [v.strip() for v in value.split(",") if v.strip()]
    if not items or not all(v.startswith(("GPU-", "MIG-")) for v in items):
        return None
    found: list[int] = []
    unknown: list[str] = []
    for item in items:
        if item.startswith("MIG-"):
            continue
        hits = [g.index for g in gpus if g.uuid == item] or [g.index for g in gpus if g.uuid.startswith(item)]
        if len(hits) == 1:
            found.append(hits[0])
        else:
            unknown.append(item)
    return tuple(sorted(set(found))), tuple(unknown)


# -- the check (pure) ----------------------------------------------------------------------------
def check_node(host: str, node_map: NodeMap, *, slurm_gpus: int | None = None,
               slurm_alloc: Mapping[str, Sequence[int]] | None = None, metric_uuids: Mapping[int, str] | None = None,
               processes: Iterable[GpuProcess] = ()) -> MapCheck:
    """Compare one node's numberings (see the module docstring); every disagreement is named.

    :param slurm_gpus: GPUs Slurm counts on the node (its GRES), None or 0 when unknown.
    :param slurm_alloc: running job id → Slurm's GPU indices of that job on this node.
    :param metric_uuids: NVML index → UUID as the metrics label it (empty UUIDs are ignored).
    :param processes: the GPU processes read on this node (their UUID, job and environment).
    """
    problems: list[str] = []
    checked: list[str] = []
    if not node_map.reported:
        return MapCheck(host, (), ("not checked: the node wrapper reported no GPU numbering",))
    if node_map.error:
        return MapCheck(host, (f"GPU numbering unreadable: {node_map.error}",), ())
    nvml = node_map.nvml
    if not nvml:
        if slurm_gpus:
            problems.append(f"Slurm counts {slurm_gpus} GPUs, nvidia-smi shows none")
        return MapCheck(host, tuple(problems), ("nvidia-smi",))
    by_index = {g.index: g for g in nvml}
    by_uuid = {g.uuid: g for g in nvml}
    if len(by_index) != len(nvml) or len(by_uuid) != len(nvml):
        problems.append("nvidia-smi lists an index or a UUID twice")
    if sorted(by_index) != list(range(len(nvml))):
        problems.append(f"NVML indices are not 0..{len(nvml) - 1}: {sorted(by_index)}")
    checked.append("nvidia-smi")

    if node_map.driver:
        checked.append("driver minors")
        drv = {d.bus_id: d for d in node_map.driver}
        for g in nvml:
            d = drv.get(g.bus_id)
            if d is None:
                problems.append(f"GPU {g.index} ({g.bus_id}) has no driver entry")
            elif d.uuid and d.uuid != g.uuid:
                problems.append(f"GPU {g.index} at {g.bus_id}: nvidia-smi says {g.uuid}, the driver {d.uuid}")
        # Slurm's IDX k is the k-th device file in minor order: it must be NVML index k
        minors = sorted((d.minor, d.bus_id) for d in node_map.driver if d.minor is not None and d.bus_id in
                        {g.bus_id for g in nvml})
        by_bus = {g.bus_id: g for g in nvml}
        for k, (minor, bus) in enumerate(minors):
            if by_bus[bus].index != k:
                problems.append(f"/dev/nvidia{minor} (Slurm IDX {k}) is NVML index {by_bus[bus].index} "
                                f"({by_bus[bus].uuid})")

    devices = node_map.slurm_devices()
    if slurm_gpus:
        checked.append("slurm gres")
        if slurm_gpus != devices:
            shown = f"{len(nvml)}" if devices == len(nvml) else f"{devices} (MIG slices counted one by one)"
            problems.append(f"Slurm counts {slurm_gpus} GPUs, nvidia-smi shows {shown}")
    for job_id, idx in sorted((slurm_alloc or {}).items()):
        beyond = sorted(i for i in idx if not 0 <= i < devices)
        if beyond:
            problems.append(f"job {job_id} holds IDX {beyond}, which nvidia-smi does not show")

    seen_metrics = {int(i): u for i, u in (metric_uuids or {}).items() if u}
    if seen_metrics:
        checked.append("metrics uuids")
    for i, u in sorted(seen_metrics.items()):
        known = by_index.get(i)
        if known is None:
            problems.append(f"the metrics have GPU {i} ({u}), nvidia-smi does not")
        elif known.uuid != u:
            problems.append(f"the metrics call GPU {i} {u}, nvidia-smi calls it {known.uuid}")

    alloc = {j: set(int(i) for i in idx) for j, idx in (slurm_alloc or {}).items()}
    for p in processes:
        on = by_uuid.get(p.gpu_uuid)
        if p.job_id and p.job_id in alloc and on is not None and on.index not in alloc[p.job_id]:
            problems.append(f"process {p.pid} of job {p.job_id} runs on GPU {on.index} ({on.uuid}); "
                            f"Slurm gave the job IDX {sorted(alloc[p.job_id])}")
        vis = visible_devices(node_map.visible.get(p.pid), nvml)
        if vis is None:
            continue
        checked.append("CUDA_VISIBLE_DEVICES")
        indices, unknown = vis
        if unknown:
            problems.append(f"process {p.pid}'s CUDA_VISIBLE_DEVICES names {', '.join(unknown)}, unknown here")
        if p.job_id and p.job_id in alloc and not set(indices) <= alloc[p.job_id]:
            problems.append(f"process {p.pid} of job {p.job_id} sees GPUs {list(indices)} (by UUID); "
                            f"Slurm gave the job IDX {sorted(alloc[p.job_id])}")
    return MapCheck(host, tuple(dict.fromkeys(problems)), tuple(dict.fromkeys(checked)))


def check_snapshot_nodes(maps: Mapping[str, NodeMap], frame: pd.DataFrame, jobs: Iterable[Job],
                         nodes: Iterable[Node], processes: Iterable[GpuProcess]) -> list[MapCheck]:
    """Run :func:`check_node` for each inspected node with what the snapshot knows of it."""
    gres = {n.name: int(n.gpus_total or 0) for n in nodes}
    alloc: dict[str, dict[str, list[int]]] = {}
    for j in jobs:
        if j.running:
            for host, idx in j.gpu_alloc:
                alloc.setdefault(host, {})[j.job_id] = [int(i) for i in idx]
    procs: dict[str, list[GpuProcess]] = {}
    for p in processes:
        procs.setdefault(p.host, []).append(p)
    uuids: dict[str, dict[int, str]] = {}
    if len(frame) and "uuid" in frame:
        for host, gpu, uuid in zip(frame["host"], frame["gpu"], frame["uuid"].fillna(""), strict=True):
            if uuid:
                uuids.setdefault(str(host), {})[int(gpu)] = str(uuid)
    return [check_node(host, m, slurm_gpus=gres.get(host) or None, slurm_alloc=alloc.get(host, {}),
                       metric_uuids=uuids.get(host, {}), processes=procs.get(host, ()))
            for host, m in sorted(maps.items())]


def apply(frame: pd.DataFrame, checks: Iterable[MapCheck], windows: Mapping[float, pd.DataFrame] | None = None,
          ) -> tuple[pd.DataFrame, dict[float, pd.DataFrame], list[str]]:
    """Return ``frame`` and its other windows (:func:`stale_hosts`) with every GPU of a disagreeing node ``stale``, and
    one problem per such node."""
    bad = {c.host: c for c in checks if not c.ok}
    problems = [f"gpu index check on {h}: {'; '.join(c.problems[:3])} (its GPUs are treated as stale)"
                for h, c in sorted(bad.items())]
    frame, others = stale_hosts(frame, bad, windows)
    for p in problems:
        logger.warning("%s", p)
    return frame, others, problems


def stale_hosts(frame: pd.DataFrame, hosts: Iterable[str], windows: Mapping[float, pd.DataFrame] | None = None,
                ) -> tuple[pd.DataFrame, dict[float, pd.DataFrame]]:
    """Return ``frame`` and the columns of its other windows (each aligned with it, row for row) with every GPU of
    ``hosts`` (nodes whose numbering is in doubt) ``stale`` in each: no rule reads them as idle, whatever window it
    judges over (a rule with a window of its own reads that window's ``stale``). Unchanged, not copied, when there
    is none."""
    hosts = list(hosts)
    windows = dict(windows or {})
    if not hosts or not len(frame):
        return frame, windows
    doubt = frame["host"].astype(str).isin(hosts).to_numpy(dtype=bool)

    def marked(f: pd.DataFrame) -> pd.DataFrame:
        return f.assign(stale=f["stale"].to_numpy(dtype=bool) | doubt)

    return marked(frame), {w: marked(f) for w, f in windows.items()}


def node_map_from(data: Mapping[str, Any], host: str) -> NodeMap:
    """Build a :class:`NodeMap` from the wrapper's ``inspect`` answer (keys ``map``, ``driver_gpus``, ``procs``)."""
    res = data.get("map")
    if res is None:
        return NodeMap(reported=False)
    if not isinstance(res, Mapping):
        raise SourceError(f"{host}: inspect's 'map' is not an object")
    if res.get("rc", 1) != 0:
        return NodeMap(error=f"nvidia-smi exited {res.get('rc')}: {str(res.get('stderr', '')).strip()[:200]}")
    nvml = parse_map(str(res.get("stdout", "")), host)
    files = data.get("driver_gpus") or {}
    if not isinstance(files, Mapping):
        raise SourceError(f"{host}: inspect's 'driver_gpus' is not an object")
    visible: dict[int, str] = {}
    for pid, info in (data.get("procs") or {}).items():
        value = info.get("cuda_visible_devices") if isinstance(info, Mapping) else None
        if isinstance(value, str) and str(pid).isdigit():
            visible[int(pid)] = value
    return NodeMap(nvml=nvml, driver=parse_driver_info(files, host), visible=visible)


#: a node's numbering is in doubt when renumbering its GPUs explains this share of its GPU-time more than
#: the scheduler's numbering does. What no numbering explains (a zombie, an idle allocation, a scrape's lag at a
#: job's edges) costs every numbering alike; only a node whose exporter numbers GPUs otherwise gains from one
MIN_RENUMBER_GAIN = 0.1
#: ...and that gain is at least this many GPU-seconds (an hour): a short trace proves nothing
MIN_RENUMBER_GAIN_S = 3600.0


def trace_numbering(hosts: Sequence[str], gpus: Sequence[int], in_use: Any, known: Any, held: Any, step_s: float,
                    ) -> dict[str, dict[int, int]]:
    """Return, per node whose GPU numbering in a trace is in doubt, the renumbering its samples agree with.

    A trace has no ``nvidia-smi`` to ask (:func:`check_node`), but it has the answer's consequences: a GPU
    computes (``in_use``) only while a job holds it. On a node whose exporter numbers GPUs as the scheduler does,
    the scheduler's numbering explains that best. On one whose ``gres.conf`` lists its devices in another order
    (or whose ``CUDA_DEVICE_ORDER`` differs), another numbering explains it better: there a job's GPUs as the
    samples number them are another job's, its work reads as idle and a finished job's free GPU as its own.

    Only computing counts, not memory held: memory on a GPU no job holds is a zombie, and a zombie beside an idle
    allocation started with it (the same user's two jobs) is explained as well by swapping their GPUs. What
    waste looks like cannot testify about the numbering the waste is read by.

    :param hosts: each row's node; ``gpus``: each row's GPU index as the samples number it.
    :param in_use: rows x steps, bool, the GPU computes; ``known``: rows x steps, bool (a sample there);
        ``held``: rows x steps, bool, a job holds the GPU of that index as the scheduler numbers it.
    :returns: node → {the samples' GPU index: the scheduler's index it agrees with}, for nodes where that
        renumbering explains :data:`MIN_RENUMBER_GAIN` of the node's sampled GPU-time more than the identity, and at
        least :data:`MIN_RENUMBER_GAIN_S`.
    """
    import numpy as np

    by_host: dict[str, list[int]] = {}
    for r, name in enumerate(hosts):
        by_host.setdefault(str(name), []).append(r)
    out: dict[str, dict[int, int]] = {}
    for host, rows in by_host.items():
        if len(rows) < 2 or len(rows) > 64:
            continue
        k = np.asarray(known[rows], dtype=bool)
        total = float(k.sum())
        if not total:
            continue
        u = np.asarray(in_use[rows], dtype=bool) & k
        free = ~np.asarray(in_use[rows], dtype=bool) & k
        h = np.asarray(held[rows], dtype=float)
        # agree[e, s]: the steps where the samples' GPU e computes while the scheduler's GPU s is held, or not while
        # it is not
        agree = u.astype(float) @ h.T + free.astype(float) @ (1.0 - h).T
        ident = float(np.trace(agree))
        assign = _best_assignment(agree)
        best = float(agree[np.arange(len(rows)), assign].sum())
        gain = best - ident
        if gain >= MIN_RENUMBER_GAIN * total and gain * step_s >= MIN_RENUMBER_GAIN_S:
            out[host] = {int(gpus[rows[e]]): int(gpus[rows[s]]) for e, s in enumerate(assign) if s != e}
    return out


def trace_claims(hosts: Sequence[str], gpus: Sequence[int], times: Any, util: Any, labelled: Any,
                 claims: Iterable[tuple[Any, float, float]], busy_util: float, step_s: float,
                 ) -> dict[str, dict[int, int]]:
    """Return :func:`trace_numbering` of a trace's dense matrices (GPU rows x ``times``) against the jobs that the
    jobs file places by ``gpu_ids`` (``claims``: each job's rows, start and end). Only hosts such a job is placed on
    and whose samples carry no job label (``labelled``: per row) are asked: a label is the exporter's own word on
    whose a GPU is, whatever its number."""
    import numpy as np

    placed = [([int(x) for x in r], float(a), float(b)) for r, a, b in claims]
    labelled_hosts = {str(hosts[int(r)]) for r in np.flatnonzero(np.asarray(labelled, dtype=bool))}
    asked = {str(hosts[r]) for rows, _, _ in placed for r in rows} - labelled_hosts
    rows = np.array([r for r, h in enumerate(hosts) if str(h) in asked], dtype=np.int64)
    if not len(rows) or not len(times):
        return {}
    at = {int(r): i for i, r in enumerate(rows.tolist())}
    held = np.zeros((len(rows), len(times)), dtype=bool)
    for mine, start, end in placed:
        lo, hi = int(np.searchsorted(times, start, side="left")), int(np.searchsorted(times, end, side="left"))
        idx = [at[r] for r in mine if r in at]
        if idx and hi > lo:
            held[idx, lo:hi] = True
    u = np.asarray(util)[rows]
    with np.errstate(invalid="ignore"):
        in_use = u >= busy_util
    known = ~np.isnan(u)
    return trace_numbering([str(hosts[r]) for r in rows], [int(gpus[r]) for r in rows], in_use, known, held, step_s)


def numbering_note(found: Mapping[str, Mapping[int, int]]) -> str:
    """Return what :func:`trace_claims` found, in words: the nodes, the first one's renumbering, what to do."""
    host, moves = sorted(found.items())[0]
    shown = ", ".join(f"its GPU {e} is the jobs' GPU {s}" for e, s in sorted(moves.items())[:3])
    more = "…" if len(moves) > 3 or len(found) > 1 else ""
    return (f"{len(found)} node(s) number their GPUs otherwise than the jobs file's gpu_ids ({host}: {shown}{more}): "
            "their GPUs compute while no job holds them and rest while one does, until renumbered. Read as "
            "numbered, a job's GPUs there would be another's, so no rule judged those nodes' GPUs. If the exporter "
            "numbers GPUs otherwise than Slurm (gres.conf order, CUDA_DEVICE_ORDER), write Slurm's index in the gpu "
            "column")


def _best_assignment(score: Any) -> list[int]:
    """Return the column of each row that maximises the sum of ``score`` (square), one row per column: the Hungarian
    method on the costs ``-score`` (a node's GPUs: a handful of rows)."""
    n = len(score)
    cost = [[-float(x) for x in row] for row in score]
    inf = float("inf")
    u, v = [0.0] * (n + 1), [0.0] * (n + 1)
    p, way = [0] * (n + 1), [0] * (n + 1)  # p[j]: the row matched to column j (1-based; 0: none)
    for i in range(1, n + 1):
        p[0], j0 = i, 0
        minv, used = [inf] * (n + 1), [False] * (n + 1)
        while True:
            used[j0] = True
            i0, delta, j1 = p[j0], inf, 0
            for j in range(1, n + 1):
                if not used[j]:
                    cur = cost[i0 - 1][j - 1] - u[i0] - v[j]
                    if cur < minv[j]:
                        minv[j], way[j] = cur, j0
                    if minv[j] < delta:
                        delta, j1 = minv[j], j
            for j in range(n + 1):
                if used[j]:
                    u[p[j]] += delta
                    v[j] -= delta
                else:
                    minv[j] -= delta
            j0 = j1
            if p[j0] == 0:
                break
        while j0:
            j1 = way[j0]
            p[j0] = p[j1]
            j0 = j1
    out = [0] * n
    for j in range(1, n + 1):
        out[p[j] - 1] = j - 1
    return out
