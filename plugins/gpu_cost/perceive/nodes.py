"""GPU processes on the nodes, over SSH: nvidia-smi plus ``/proc``, attributed to jobs or to nobody.

One remote command per node: the node wrapper's ``inspect`` verb (``include/node/gpu-cost-node-action``)
runs ``nvidia-smi --query-gpu=...`` and ``--query-compute-apps=pid,gpu_uuid,used_memory`` and reads,
for each PID, ``/proc/<pid>/stat`` (start time: field 22 plus the boot time) and
``/proc/<pid>/cgroup``. The raw text comes back as JSON and is parsed here, so a node never runs
more than the wrapper. Each process is attributed to a Slurm job (``job_<id>`` in its cgroup path,
else ``SLURM_JOB_ID`` in its environment), a container (docker, containerd, podman, cri-o,
Kubernetes pods: ``GpuProcess.container`` is ``<runtime>:<short id>``, e.g. ``docker:4f6c3a1be2d9``),
or nothing: an orphan.

Job logs: :meth:`NodeSource.job_log` asks a job's batch node for the tail of its StdOut/StdErr
through the wrapper's read-only ``job-log`` verb (the node checks with Slurm that the job runs its
batch script there and reads only the job's own files, owned by the job's uid; it also reports the
newest of the job's files in its working directory, from metadata only, and the CPU and I/O of
the job's own processes there over one second) and returns the
dict the snapshot keeps in ``Snapshot.job_logs`` (see :func:`parse_job_log`); a failure is an
``{"error": ...}`` entry, never an exception.

Connection ``gpu_cost_node_ssh`` (Airflow SSH provider). Extras read here besides the provider's:
``node_command`` (the wrapper as the node runs it: a list or a shell-quoted string, default
``gpu-cost-node-action``; with a forced command anything works), ``hosts`` (node name → address)
and ``host_template`` (``{node}.cluster.example``). Unparsable output raises
:class:`~gpu_cost.core.errors.SourceError` naming the host and the line.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import shlex
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpu_cost.core import connections
from gpu_cost.core.errors import SourceError
from gpu_cost.core.model import GpuProcess, Job
from gpu_cost.perceive.gpu_map import NodeMap, bus_id, node_map_from
from gpu_cost.perceive.runner import Runner

logger = logging.getLogger(__name__)

CONN_ID = "gpu_cost_node_ssh"
WRAPPER = "gpu-cost-node-action"
GPU_FIELDS = ("index", "uuid", "name", "memory.total", "memory.used", "utilization.gpu")
APP_FIELDS = ("pid", "gpu_uuid", "used_memory")
_JOB = re.compile(r"/job_([0-9]+)(?:/|$)")
_CONTAINER = (
    ("docker", re.compile(r"/docker[-/]([0-9a-f]{12,64})(?:\.scope)?")),
    ("containerd", re.compile(r"cri-containerd-([0-9a-f]{12,64})\.scope")),
    ("podman", re.compile(r"/libpod-([0-9a-f]{12,64})(?:\.scope)?")),
    ("cri-o", re.compile(r"crio-([0-9a-f]{12,64})(?:\.scope)?")),
    ("kubepods", re.compile(r"/kubepods[^\n]*/([0-9a-f]{64})$")),
)
_NA = {"[N/A]", "[Not Supported]", "N/A", ""}
#: the wrapper's bounds for ``job-log``'s max_bytes (per file)
JOB_LOG_MIN_BYTES, JOB_LOG_MAX_BYTES = 512, 65536


@dataclass(frozen=True)
class NodeGpu:
    """One GPU as ``nvidia-smi --query-gpu`` shows it."""

    index: int
    uuid: str
    name: str
    memory_total_mib: float | None
    memory_used_mib: float | None
    util: float | None


@dataclass(frozen=True)
class MigDevice:
    """One MIG slice as ``nvidia-smi -L`` lists it under its GPU."""

    gpu: int
    device: int
    profile: str
    uuid: str
    #: its GPU instance id (dcgm-exporter's ``GPU_I_ID``) from ``nvidia-smi -q``; "" from a wrapper that does not report it
    gi: str = ""


@dataclass
class NodeInspection:
    """What one node showed: GPUs, GPU processes, and any trouble reading it."""

    host: str
    gpus: list[NodeGpu] = field(default_factory=list)
    processes: list[GpuProcess] = field(default_factory=list)
    #: the node's GPU numbering for the index check (:mod:`gpu_cost.perceive.gpu_map`)
    gpu_map: NodeMap = field(default_factory=lambda: NodeMap(reported=False))
    #: MIG slices by MIG UUID (empty: no GPU in MIG mode, or a wrapper that does not list them)
    mig: dict[str, MigDevice] = field(default_factory=dict)


_LIST_GPU = re.compile(r"^GPU (\d+): .* \(UUID: (GPU-[^)]+)\)$")
_LIST_MIG = re.compile(r"^\s+MIG (\S+)\s+Device\s+(\d+): \(UUID: (MIG-[^)]+)\)$")


def parse_mig_listing(text: str, host: str) -> dict[str, MigDevice]:
    """Parse ``nvidia-smi -L``: the MIG slices under each GPU (``  MIG 1g.10gb     Device  0: (UUID: MIG-...)``)."""
    out: dict[str, MigDevice] = {}
    gpu: int | None = None
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        m = _LIST_GPU.match(line.rstrip())
        if m:
            gpu = int(m.group(1))
            continue
        m = _LIST_MIG.match(line.rstrip())
        if m is None:
            continue  # other lines (a driver banner) say nothing of slices
        if gpu is None:
            raise SourceError(f"{host}: nvidia-smi -L line {lineno}: a MIG device before any GPU: {line!r}")
        out[m.group(3)] = MigDevice(gpu=gpu, device=int(m.group(2)), profile=m.group(1), uuid=m.group(3))
    return out


_Q_GPU = re.compile(r"^GPU ([0-9A-Fa-f]+:[0-9A-Fa-f]+:[0-9A-Fa-f]+\.[0-9A-Fa-f])\s*$")
_Q_FIELD = re.compile(r"^(\s*)(\S[^:]*?)\s*:\s*(.*?)\s*$")


def parse_mig_query(text: str, host: str, bus_index: Mapping[str, int]) -> dict[tuple[int, int], tuple[int, int]]:
    """Parse the ``MIG Devices`` sections of ``nvidia-smi -q``: ``(gpu, MIG device index) -> (GI id, CI id)``.

    Each GPU block (``GPU 00000000:07:00.0``) lists its slices as ``MIG Device`` entries with
    ``Index`` (the ``Device <N>`` of ``nvidia-smi -L``), ``GPU Instance ID`` and ``Compute Instance
    ID``. ``bus_index`` maps a normalised PCI bus id (:func:`~gpu_cost.perceive.gpu_map.bus_id`) to
    the GPU's index; without it a block is the n-th GPU in index order, as nvidia-smi prints them.
    Raises SourceError naming the host and line on a malformed section.
    """
    out: dict[tuple[int, int], tuple[int, int]] = {}
    gpu: int | None = None
    blocks = -1
    section = device = None  # indentation of "MIG Devices" / "MIG Device"
    entry: dict[str, tuple[int, int]] = {}  # field -> (value, line number)
    start = 0

    def close(lineno: int) -> None:
        if device is None:
            return
        missing = [k for k in ("Index", "GPU Instance ID") if k not in entry]
        if missing:
            raise SourceError(f"{host}: nvidia-smi -q line {start}: MIG device without {' / '.join(missing)}")
        assert gpu is not None
        key = (gpu, entry["Index"][0])
        if key in out:
            raise SourceError(f"{host}: nvidia-smi -q line {entry['Index'][1]}: MIG device index {key[1]} "
                              f"listed twice on GPU {gpu}")
        out[key] = (entry["GPU Instance ID"][0], entry.get("Compute Instance ID", (0, 0))[0])

    lines = text.splitlines()
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        if device is not None and indent <= device:
            close(lineno)
            device = None
        if section is not None and indent <= section:
            section = None
        m = _Q_GPU.match(line)
        if m:
            blocks += 1
            try:
                gpu = bus_index[bus_id(m.group(1))] if bus_index else blocks
            except KeyError:
                raise SourceError(f"{host}: nvidia-smi -q line {lineno}: GPU {m.group(1)} is not among the node's "
                                  "GPUs") from None
            continue
        name = line.strip()
        if name.startswith("MIG Devices"):
            if gpu is None:
                raise SourceError(f"{host}: nvidia-smi -q line {lineno}: MIG devices before any GPU: {line!r}")
            section = indent
            continue
        if section is None:
            continue
        if name == "MIG Device":
            device, entry, start = indent, {}, lineno
            continue
        f = _Q_FIELD.match(line)
        if device is None or f is None or f.group(2) not in ("Index", "GPU Instance ID", "Compute Instance ID"):
            continue  # a slice's attributes, memory, ECC counters ...
        if not f.group(3).isdigit():
            raise SourceError(f"{host}: nvidia-smi -q line {lineno}: {f.group(2)} {f.group(3)!r} is not a number: "
                              f"{line!r}")
        entry[f.group(2)] = (int(f.group(3)), lineno)
    close(len(lines))
    return out


# ---------------------------------------------------------------------------------------------
# parsers (pure, tested from captured real output)


def _split_csv(text: str, n: int, host: str, what: str) -> list[tuple[int, list[str]]]:
    rows = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != n:
            raise SourceError(f"{host}: {what} line {lineno}: expected {n} fields, got {len(parts)}: {line!r}")
        rows.append((lineno, parts))
    return rows


def _num(value: str, host: str, what: str, lineno: int, line: str) -> float | None:
    value = value.strip()
    if value in _NA:
        return None
    value = re.sub(r"\s*(MiB|%|W)$", "", value)
    try:
        return float(value)
    except ValueError:
        raise SourceError(f"{host}: {what} line {lineno}: {value!r} is not a number: {line!r}") from None


def parse_gpus(text: str, host: str) -> list[NodeGpu]:
    """Parse ``nvidia-smi --query-gpu=index,uuid,name,memory.total,memory.used,utilization.gpu
    --format=csv,noheader,nounits``."""
    what = "nvidia-smi --query-gpu"
    out = []
    for lineno, parts in _split_csv(text, len(GPU_FIELDS), host, what):
        line = ", ".join(parts)
        if parts[0] == "index":
            continue  # a header line: --format=csv without noheader
        if not parts[0].isdigit():
            raise SourceError(f"{host}: {what} line {lineno}: index {parts[0]!r} is not a number: {line!r}")
        out.append(NodeGpu(int(parts[0]), parts[1], parts[2], _num(parts[3], host, what, lineno, line),
                           _num(parts[4], host, what, lineno, line), _num(parts[5], host, what, lineno, line)))
    return out


def parse_apps(text: str, host: str) -> list[tuple[int, str, float]]:
    """Parse ``nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory --format=csv,noheader,nounits``."""
    what = "nvidia-smi --query-compute-apps"
    out = []
    for lineno, parts in _split_csv(text, len(APP_FIELDS), host, what):
        line = ", ".join(parts)
        if parts[0] == "pid":
            continue
        if not parts[0].isdigit():
            raise SourceError(f"{host}: {what} line {lineno}: pid {parts[0]!r} is not a number: {line!r}")
        used = _num(parts[2], host, what, lineno, line)
        out.append((int(parts[0]), parts[1], 0.0 if used is None else used))
    return out


def start_ticks(stat: str, host: str = "?", pid: int | str = "?") -> int:
    """Return field 22 (starttime, clock ticks after boot) of a ``/proc/<pid>/stat`` line."""
    try:
        rest = stat[stat.rindex(")") + 2:].split()
        return int(rest[19])
    except (ValueError, IndexError):
        raise SourceError(f"{host}: /proc/{pid}/stat is not a stat line: {stat[:120]!r}") from None


def _env_job_id(value: Any) -> str | None:
    """The ``SLURM_JOB_ID`` a process's environment named, when it is a job id at all (opaque text)."""
    from gpu_cost.perceive.slurm import JOB_ID

    text = str(value).strip() if value else ""
    return text if text and JOB_ID.fullmatch(text) else None


def job_from_cgroup(text: str) -> str | None:
    """Return the Slurm job id in a ``/proc/<pid>/cgroup`` (``.../job_1234/step_0/...``), or None."""
    for line in text.splitlines():
        m = _JOB.search(line)
        if m:
            return m.group(1)
    return None


def container_from_cgroup(text: str) -> str | None:
    """Return a short container id from a ``/proc/<pid>/cgroup`` (docker, containerd, podman, k8s), or None."""
    found = container_of(text)
    return found[1] if found else None


def container_of(text: str) -> tuple[str, str] | None:
    """Return ``(runtime, short id)`` of a containerised ``/proc/<pid>/cgroup``, or None.

    The runtime is ``kubepods`` for anything under a Kubernetes pod (whichever runtime runs it),
    else ``docker``, ``containerd``, ``podman`` or ``cri-o``.
    """
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        for runtime, rx in _CONTAINER:
            m = rx.search(path)
            if m:
                return ("kubepods" if "/kubepods" in path else runtime), m.group(1)[:12]
    return None


def _with_instances(mig: dict[str, MigDevice], res: Any, host: str,
                    bus_index: Mapping[str, int]) -> dict[str, MigDevice]:
    """``mig`` with each slice's GPU instance id from the wrapper's ``mig_query`` (``nvidia-smi -q``).

    A wrapper that does not report it (or an ``nvidia-smi -q`` that failed) leaves the ids unknown:
    the slices are then joined to the metrics by profile only (:func:`gpu_cost.perceive.correlate.join_mig_uuids`).
    """
    if not mig or res is None:
        return mig
    if not isinstance(res, Mapping):
        raise SourceError(f"{host}: inspect's 'mig_query' is not an object")
    if res.get("rc", 1) != 0:
        logger.warning("%s: nvidia-smi -q exited %s (%s): MIG slices joined by profile only", host, res.get("rc"),
                       _one_line(str(res.get("stderr", "")), 200))
        return mig
    ids = parse_mig_query(str(res.get("stdout", "")), host, bus_index)
    return {u: dataclasses.replace(d, gi=str(ids[(d.gpu, d.device)][0])) if (d.gpu, d.device) in ids else d
            for u, d in mig.items()}


def parse_inspect(text: str, host: str) -> NodeInspection:
    """Parse the wrapper's ``inspect`` JSON into GPUs and attributed GPU processes."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SourceError(f"{host}: inspect did not answer JSON (line {exc.lineno}): {text[:200]!r}") from None
    if not isinstance(data, Mapping) or data.get("verb") != "inspect":
        raise SourceError(f"{host}: inspect answered something else: {text[:200]!r}")
    for key in ("gpus", "apps"):
        res = data.get(key) or {}
        if res.get("rc", 1) != 0:
            raise SourceError(f"{host}: nvidia-smi failed ({res.get('rc')}): {str(res.get('stderr', '')).strip()[:200]}")
    gpus = parse_gpus(data["gpus"].get("stdout", ""), host)
    index_of = {g.uuid: g.index for g in gpus}
    listing = data.get("list") or {}
    mig = parse_mig_listing(str(listing.get("stdout", "")), host) if listing.get("rc", 1) == 0 else {}
    node_map = node_map_from(data, host)
    mig = _with_instances(mig, data.get("mig_query"), host, {g.bus_id: g.index for g in node_map.nvml})
    index_of.update({u: d.gpu for u, d in mig.items()})  # a process on a slice names the slice's MIG UUID
    try:
        btime = float(data["btime"])
        tck = float(data["clk_tck"])
    except (KeyError, TypeError, ValueError):
        raise SourceError(f"{host}: inspect gave no boot time / clock tick") from None
    procs_info: Mapping[str, Any] = data.get("procs") or {}
    out = []
    for pid, uuid, used in parse_apps(data["apps"].get("stdout", ""), host):
        info = procs_info.get(str(pid)) or {}
        stat = info.get("stat")
        if not stat:
            logger.info("%s: GPU process %d exited while being inspected", host, pid)
            continue
        start = btime + start_ticks(stat, host, pid) / tck
        cgroup = info.get("cgroup") or ""
        job = job_from_cgroup(cgroup) or _env_job_id(info.get("slurm_job_id"))
        name = stat[stat.find("(") + 1:stat.rfind(")")] if "(" in stat else ""
        found = container_of(cgroup)
        container = f"{found[0]}:{found[1]}" if found else None
        out.append(GpuProcess(host=host, pid=pid, gpu_uuid=uuid, gpu=index_of.get(uuid), used_mib=used,
                              start_ts=float(int(start)), job_id=job, container=container,
                              user=str(info.get("user", "")), name=name,
                              mig_profile=mig[uuid].profile if uuid in mig else "",
                              mig=mig[uuid].gi if uuid in mig else ""))
    slices = Counter(m.gpu for m in mig.values())
    node_map = dataclasses.replace(node_map, mig_slices=dict(slices))
    return NodeInspection(host=host, gpus=gpus, processes=out, gpu_map=node_map, mig=mig)


def _one_line(text: str, limit: int = 300) -> str:
    return " ".join(str(text).split())[:limit]


def parse_job_log(text: str, host: str, job_id: str) -> dict[str, Any]:
    """Turn the wrapper's ``job-log`` JSON into the snapshot's log entry.

    Returns ``{"path": <stdout path>, "size": <bytes of the files read>, "mtime": <newest mtime>,
    "text": <stdout tail, then the stderr tail when it is a separate file>, "files": [<as the
    wrapper gave them>], "workdir_mtime": <newest mtime of a file in the job's working directory or
    its immediate subdirectories, or None>, "workdir_newest": <that file, relative to the working
    directory, or None>, "cpu_cores": <CPU cores the job's processes on that node used over the
    wrapper's one-second sample, or None>, "io_bps": <their reads and writes, bytes/s, or None>,
    "error": None}``; ``{"error": "<host>: ...", "files": [...], "workdir_mtime", "workdir_newest",
    "cpu_cores", "io_bps"}`` when no log file could be read (each refusal names its reason). A
    wrapper that did not scan the working directory or sample the processes (an older one, or one
    refused, or one that saw no process of the job) gives ``None`` for those. Raises SourceError on
    an answer that is not the wrapper's.
    """
    from gpu_cost.core.redact import redact

    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SourceError(f"{host}: job-log did not answer JSON (line {exc.lineno}): {text[:200]!r}") from None
    if not isinstance(data, Mapping) or data.get("verb") != "job-log" or not isinstance(data.get("files"), list):
        raise SourceError(f"{host}: job-log answered something else: {text[:200]!r}")
    files: list[dict[str, Any]] = []
    for f in data["files"]:
        if not isinstance(f, Mapping) or not isinstance(f.get("path"), str):
            raise SourceError(f"{host}: job-log listed a file without a path: {str(f)[:200]!r}")
        entry = dict(f)
        if "refused" not in entry:
            if not isinstance(entry.get("tail"), str):
                raise SourceError(f"{host}: job-log gave {entry['path']!r} without a tail")
            entry["tail"] = redact(entry["tail"])  # a log may print a URL with its password, a token
        files.append(entry)
    wd = {**_workdir(data.get("workdir")), **_activity(data.get("activity"))}
    read = [f for f in files if "refused" not in f]
    if not read:
        why = "; ".join(f"{f.get('stream', '?')} {f['path']}: {f['refused']}" for f in files) or "no output file"
        return {"error": _one_line(f"{host}: job {job_id}'s log not read: {why}", 500), "files": files, **wd}
    main = next((f for f in read if str(f.get("stream", "")).startswith("stdout")), read[0])
    text_parts = [f["tail"] for f in sorted(read, key=lambda f: 0 if f is main else 1)]
    joined = ""
    for part in text_parts:
        if joined and not joined.endswith("\n"):
            joined += "\n"
        joined += part
    sizes = [float(f["size"]) for f in read if isinstance(f.get("size"), int | float)]
    mtimes = [float(f["mtime"]) for f in read if isinstance(f.get("mtime"), int | float)]
    return {"path": main["path"], "size": int(sum(sizes)) if sizes else None,
            "mtime": max(mtimes) if mtimes else None, "text": joined, "files": files, **wd, "error": None}


def _workdir(scan: Any) -> dict[str, Any]:
    """``workdir_mtime``/``workdir_newest`` out of the wrapper's ``workdir`` scan (None when absent or refused)."""
    from gpu_cost.core.redact import redact

    if not isinstance(scan, Mapping) or "refused" in scan:
        return {"workdir_mtime": None, "workdir_newest": None}
    mtime, name = scan.get("newest_mtime"), scan.get("newest")
    if not isinstance(mtime, int | float) or isinstance(mtime, bool) or mtime != mtime:
        return {"workdir_mtime": None, "workdir_newest": None}
    return {"workdir_mtime": float(mtime),
            "workdir_newest": _one_line(redact(name), 300) if isinstance(name, str) else None}


def _activity(sample: Any) -> dict[str, Any]:
    """``cpu_cores``/``io_bps`` out of the wrapper's ``activity`` sample of the job's processes: None
    when absent (an older wrapper), refused, or no process of the job was seen (nothing measured)."""
    none: dict[str, Any] = {"cpu_cores": None, "io_bps": None}
    if not isinstance(sample, Mapping) or "refused" in sample:
        return none
    pids = sample.get("pids")
    if not isinstance(pids, int) or isinstance(pids, bool) or pids <= 0:
        return none

    def number(value: Any) -> float | None:
        ok = isinstance(value, int | float) and not isinstance(value, bool) and value == value and value >= 0
        return float(value) if ok and value != float("inf") else None

    return {"cpu_cores": number(sample.get("cpu_cores")), "io_bps": number(sample.get("io_bps"))}


def job_node(job: Job) -> str | None:
    """The node whose wrapper reads a job's log: its first node (the batch host), else its first GPU host."""
    if job.nodes:
        return job.nodes[0]
    return job.gpu_alloc[0][0] if job.gpu_alloc else None


# ---------------------------------------------------------------------------------------------
# reading nodes


def _conn_extra(conn_id: str) -> dict[str, Any] | None:
    conn = connections.lookup(conn_id, SourceError)
    return None if conn is None else dict(conn.get("extra") or {})


def configured(conn_id: str = CONN_ID) -> bool:
    """Return True when the node SSH connection exists (nothing is contacted)."""
    try:
        return _conn_extra(conn_id) is not None
    except SourceError:
        return False


@dataclass
class NodeAccess:
    """How to reach the wrapper on each node."""

    conn_id: str = CONN_ID
    command: tuple[str, ...] = (WRAPPER,)
    hosts: Mapping[str, str] = field(default_factory=dict)
    host_template: str = ""

    @classmethod
    def from_connection(cls, conn_id: str = CONN_ID) -> NodeAccess:
        extra = _conn_extra(conn_id)
        if extra is None:
            raise SourceError(f"no node SSH connection: set the Airflow connection {conn_id} ({connections.env_var(conn_id)})")
        cmd = extra.get("node_command") or WRAPPER
        command = tuple(shlex.split(cmd)) if isinstance(cmd, str) else tuple(str(c) for c in cmd)
        hosts = extra.get("hosts") or {}
        if not isinstance(hosts, Mapping):
            raise SourceError(f"connection {conn_id}: extra.hosts must map node names to addresses")
        return cls(conn_id, command, {str(k): str(v) for k, v in hosts.items()}, str(extra.get("host_template") or ""))

    def address(self, node: str) -> str:
        if node in self.hosts:
            return self.hosts[node]
        return self.host_template.format(node=node) if self.host_template else node

    def runner(self, node: str) -> Runner:
        from gpu_cost.perceive.runner import SSHRunner

        return SSHRunner(self.conn_id, host=self.address(node))

    def argv(self, verb: str, *args: object) -> list[str]:
        return [*self.command, verb, *(str(a) for a in args)]


class NodeSource:
    """Inspect nodes through the wrapper.

    :param runner_for: returns a runner per node (default: SSH through ``access``).
    """

    def __init__(self, access: NodeAccess | None = None, runner_for: Callable[[str], Runner] | None = None,
                 timeout: float = 30.0) -> None:
        self.access = access or NodeAccess.from_connection()
        self.runner_for = runner_for or self.access.runner
        self.timeout = timeout

    def inspect(self, node: str) -> NodeInspection:
        """Return the GPUs and attributed GPU processes of one node; SourceError when it cannot be read."""
        res = self.runner_for(node).run(self.access.argv("inspect"), timeout=self.timeout)
        if not res.ok:
            detail = (res.stderr or res.stdout).strip()[:300]
            raise SourceError(f"{node}: `{res.command}` exited {res.rc}: {detail}")
        return parse_inspect(res.stdout, node)

    def processes(self, nodes: Iterable[str]) -> tuple[list[GpuProcess], list[str]]:
        """Return every GPU process of ``nodes`` and the problems met (a node that failed is named)."""
        found, problems = self.inspect_many(nodes)
        return [p for i in found for p in i.processes], problems

    def inspect_many(self, nodes: Iterable[str]) -> tuple[list[NodeInspection], list[str]]:
        """Return the inspections of ``nodes`` that could be read and the problems met (each names its node)."""
        from concurrent.futures import ThreadPoolExecutor

        out: list[NodeInspection] = []
        problems: list[str] = []
        names = list(dict.fromkeys(nodes))
        if not names:
            return out, problems

        def one(node: str) -> tuple[NodeInspection | None, str | None]:
            try:
                return self.inspect(node), None
            except SourceError as exc:
                logger.warning("node processes: %s", exc)
                return None, f"node processes: {exc}"

        # nodes are inspected in parallel, each bounded by the runner's timeout
        with ThreadPoolExecutor(max_workers=min(16, len(names)), thread_name_prefix="inspect") as pool:
            for found, problem in pool.map(one, names):
                if found is not None:
                    out.append(found)
                if problem:
                    problems.append(problem)
        return out, problems

    def job_log(self, node: str, job_id: str, max_bytes: int = 16384) -> dict[str, Any]:
        """Return the tail of a job's StdOut/StdErr as read on ``node`` (see :func:`parse_job_log`).

        ``max_bytes`` (per file) is kept within the wrapper's bounds (512-65536). Never raises:
        whatever goes wrong is ``{"error": "<node>: <reason>"}``.
        """
        from gpu_cost.perceive.slurm import JOB_ID

        size = max(JOB_LOG_MIN_BYTES, min(JOB_LOG_MAX_BYTES, int(max_bytes)))
        if not JOB_ID.fullmatch(str(job_id)):  # never sent to a node as an argument
            return {"error": _one_line(f"{node}: job-log {job_id!r}: not a Slurm job id", 500)}
        try:
            res = self.runner_for(node).run(self.access.argv("job-log", job_id, size), timeout=self.timeout)
            if not res.ok:
                detail = _one_line(res.stderr or res.stdout) or "no output"
                detail = detail.removeprefix(f"{WRAPPER}: ")
                return {"error": _one_line(f"{node}: job-log {job_id} exited {res.rc}: {detail}", 500)}
            return parse_job_log(res.stdout, node, job_id)
        except SourceError as exc:  # it names the node already
            return {"error": _one_line(str(exc), 500)}
        except Exception as exc:  # one job's log is extra evidence: its failure is recorded, never raised
            logger.warning("job log of %s on %s: %s", job_id, node, exc)
            return {"error": _one_line(f"{node}: job-log {job_id}: {exc}", 500)}

    def job_logs(self, jobs: Iterable[Job], max_bytes: int = 16384) -> dict[str, dict[str, Any]]:
        """Return ``job_id -> job_log(...)`` for ``jobs``, each read on its first node, in parallel."""
        from concurrent.futures import ThreadPoolExecutor

        todo: list[tuple[str, str | None]] = []
        seen: set[str] = set()
        for job in jobs:
            if job.job_id not in seen:
                seen.add(job.job_id)
                todo.append((job.job_id, job_node(job)))
        if not todo:
            return {}

        def one(item: tuple[str, str | None]) -> dict[str, Any]:
            job_id, node = item
            if node is None:
                return {"error": f"job {job_id}: no node known to read its log on"}
            return self.job_log(node, job_id, max_bytes)

        with ThreadPoolExecutor(max_workers=min(16, len(todo)), thread_name_prefix="job-log") as pool:
            return {job_id: found for (job_id, _), found in zip(todo, pool.map(one, todo), strict=True)}
