"""The join of GPUs, jobs and processes: one job's GPU is its own; every disagreement of the sources is said.

The sweep takes a fast path for the common GPU (one job holds it, no other job's process on it); these
cases pin what each kind of GPU gets, so that path and the full test agree.
"""

from __future__ import annotations

import pandas as pd
import pytest

from gpu_cost.core.model import GpuProcess, Job
from gpu_cost.perceive.correlate import attribute


def frame(labels: list[str]) -> pd.DataFrame:
    """Four GPUs on node g1 (uuids GPU-0..3), with the exporter's job label of each."""
    return pd.DataFrame({"host": ["g1"] * 4, "gpu": [0, 1, 2, 3], "uuid": [f"GPU-{i}" for i in range(4)],
                         "label_job_id": labels})


def job(job_id: str, gpus: tuple[int, ...], **kw: object) -> Job:
    return Job(job_id=job_id, user="ann", gpu_alloc=(("g1", gpus),), nodes=("g1",), **kw)  # type: ignore[arg-type]


def proc(pid: int, gpu: int, job_id: str | None) -> GpuProcess:
    return GpuProcess(host="g1", pid=pid, gpu_uuid=f"GPU-{gpu}", gpu=gpu, used_mib=1000.0, start_ts=1.0, job_id=job_id)


@pytest.mark.parametrize(("labels", "procs", "want", "said"), [
    # Slurm alone; its job's own processes and label agreeing
    (["", "", "", ""], [proc(1, 0, "7"), proc(2, 1, "7")], ["7", "7", None, None], []),
    (["7", "7", "", ""], [], ["7", "7", None, None], []),
    # the label names another running job: a conflict, whichever way the GPU looked
    (["8", "", "", ""], [], [None, "7", None, None], ["sources name different jobs: slurm=7 label=8"]),
    # a process of another running job on the GPU: a conflict
    (["", "", "", ""], [proc(3, 1, "8")], ["7", None, None, None], ["sources name different jobs: slurm=7"]),
    # an orphan (its job ended) on the job's GPU: the job keeps it, the orphan is said
    (["", "", "", ""], [proc(4, 0, "5")], ["7", "7", None, None],
     ["process 4 of ended job 5 holds 1000 MiB on a GPU Slurm allocates to running job 7"]),
    # nobody's GPU that a running job's label or process claims: a conflict; else none
    (["", "", "8", ""], [], ["7", "7", None, None], ["label names running job 8 but Slurm allocates the GPU to none"]),
    (["", "", "", ""], [proc(5, 3, "8")], ["7", "7", None, None], ["processes of running job(s) 8 on a GPU"]),
], ids=["slurm-and-own-processes", "label-agrees", "label-names-another", "process-of-another", "orphan",
        "label-on-free-gpu", "process-on-free-gpu"])
def test_each_gpu_gets_the_job_its_sources_agree_on(labels: list[str], procs: list[GpuProcess],
                                                    want: list[str | None], said: list[str]) -> None:
    jobs = [job("7", (0, 1)), job("8", (), state="RUNNING"), job("5", (2,), state="COMPLETED")]
    out, problems = attribute(frame(labels), jobs, procs)
    assert out["job_id"].tolist() == want
    how = out["attribution"].tolist()
    assert all((h == "slurm") == (w is not None) for h, w in zip(how, want, strict=True))
    assert len(problems) == len(said)
    for p, text in zip(problems, said, strict=True):
        assert text in p.what


def test_a_gpu_two_jobs_hold_or_one_shared_job_holds_is_shared() -> None:
    jobs = [job("7", (0,)), job("8", (0,)), job("9", (1,), gpu_shared=True)]
    out, problems = attribute(frame(["", "", "", ""]), jobs, [])
    assert out["job_id"].tolist() == [None, None, None, None]
    assert out["attribution"].tolist() == ["shared", "shared", "none", "none"]
    assert out["sharers"].tolist() == ["7,8", "9", "", ""] and problems == []


def _plain(gpus: pd.DataFrame, jobs: list[Job], procs: list[GpuProcess]) -> list[tuple[object, ...]]:
    """What each whole GPU gets, read GPU by GPU from the rules in :func:`attribute`'s docstring."""
    running = {j.job_id: j for j in jobs if j.running}
    out: list[tuple[object, ...]] = []
    for host, gpu, uuid, label in zip(gpus["host"], gpus["gpu"], gpus["uuid"], gpus["label_job_id"], strict=True):
        holders = {j.job_id for j in running.values() for h, idx in j.gpu_alloc if h == host and gpu in idx}
        on = [p for p in procs if (uuid and p.gpu_uuid == uuid) or (p.host == host and p.gpu == gpu)]
        cg = {p.job_id for p in on if p.job_id}
        cg_running = {c for c in cg if c in running}
        if len(holders) > 1 or any(running[h].gpu_shared for h in holders):
            out.append((None, "shared", ",".join(sorted(holders | cg_running)), ()))
            continue
        slurm = next(iter(holders), None)
        label_running = label if label in running else None
        said: tuple[str, ...] = ()
        if len({c for c in (slurm, label_running, *cg_running) if c}) > 1:
            got: tuple[object, str] = (None, "conflict")
            said = ("sources name different jobs",)
        elif slurm:
            got = (slurm, "slurm")
            said = tuple(f"process {p.pid} " for p in (p for p in procs if (p.gpu_uuid == uuid if uuid else
                                                                              (p.host, p.gpu) == (host, gpu)))
                         if not p.job_id or p.job_id not in running)
        elif label_running or cg_running:
            got, said = (None, "conflict"), ("Slurm allocates",)
        else:
            got = (None, "none")
        out.append((*got, "", said))
    return out


@pytest.mark.parametrize("seed", range(12))
def test_every_gpu_gets_what_a_plain_reading_of_the_sources_gives(seed: int) -> None:
    """Random nodes, jobs (running or not, sharing, overlapping), labels and processes (own, another's, an ended
    job's, nobody's, by UUID or by index alone): each GPU's job, attribution, sharers and disagreements are
    those of the GPU read on its own."""
    import random

    rng = random.Random(seed)
    for _case in range(40):
        rows = [(h, g) for h in ("g1", "g2") for g in range(4)]
        gpus = pd.DataFrame({"host": [h for h, _ in rows], "gpu": [g for _, g in rows],
                             "uuid": [f"GPU-{h}-{g}" if rng.random() < 0.8 else "" for h, g in rows]})
        jobs = []
        for k in range(rng.randint(0, 6)):
            alloc = tuple((h, tuple(sorted(rng.sample(range(4), rng.randint(1, 3)))))
                          for h in sorted(rng.sample(["g1", "g2"], rng.randint(1, 2))))
            jobs.append(Job(job_id=str(10 + k), user="ann", state=rng.choice(["RUNNING", "RUNNING", "COMPLETED"]),
                            gpu_alloc=alloc, nodes=tuple(h for h, _ in alloc), gpu_shared=rng.random() < 0.1))
        ids = [j.job_id for j in jobs] + ["99"]
        gpus["label_job_id"] = [rng.choice(["", "", *ids]) for _ in rows]
        procs = []
        for pid in range(rng.randint(0, 10)):
            h, g = rng.choice(rows)
            uuid = f"GPU-{h}-{g}" if rng.random() < 0.7 else ""
            procs.append(GpuProcess(host=h, pid=100 + pid, gpu_uuid=uuid, gpu=g, used_mib=500.0, start_ts=1.0,
                                    job_id=rng.choice([None, *ids])))
        out, problems = attribute(gpus, jobs, procs)
        sharers = out["sharers"].tolist() if "sharers" in out else [""] * len(rows)
        want = _plain(gpus, jobs, procs)
        assert [(j, a, s) for j, a, s, _ in want] == list(zip(out["job_id"], out["attribution"], sharers,
                                                               strict=True)), (seed, _case)
        said = [((h, g), text) for (h, g), (*_, texts) in zip(rows, want, strict=True) for text in texts]
        assert len(problems) == len(said), (seed, _case)
        for p, ((h, g), text) in zip(problems, said, strict=True):
            assert (p.host, p.gpu) == (h, g) and text in p.what, (seed, _case, p)


@pytest.mark.parametrize(("job_node", "label", "want"), [
    ("g1", "", ("7", "cgroup")),          # the job holds GPUs on the slice's node: its process says which slice
    ("g1", "7", ("7", "cgroup")),         # the exporter's label agreeing
    ("g1", "8", (None, "conflict")),      # the label names another job
    ("g2", "", (None, "conflict")),       # the job holds nothing on this node: its process there is no claim
])
def test_a_slice_no_allocation_names_is_the_job_whose_process_runs_there(job_node: str, label: str,
                                                                          want: tuple[str | None, str]) -> None:
    """Slurm's MIG gres indices do not say which slice a job got: the slice is the job's own when the job's
    process runs in it and the job holds GPUs on that node (its allocation names the parent GPU's node)."""
    gpus = pd.DataFrame({"host": ["g1"], "gpu": [0], "uuid": ["GPU-0"], "label_job_id": [label],
                         "mig": ["3"], "mig_uuid": ["MIG-a"], "mig_profile": ["1g.10gb"]})
    jobs = [Job(job_id="7", user="ann", gpu_alloc=((job_node, (0,)),), nodes=(job_node,)),
            Job(job_id="8", user="bob", gpu_alloc=(("g3", (0,)),), nodes=("g3",))]
    procs = [GpuProcess(host="g1", pid=5, gpu_uuid="MIG-a", gpu=0, used_mib=900.0, start_ts=1.0, job_id="7", mig="3")]
    out, _ = attribute(gpus, jobs, procs)
    assert (out["job_id"].iloc[0], out["attribution"].iloc[0]) == want


def test_gpus_a_running_job_may_hold_unplaced_are_nobodys_but_no_zombies_either() -> None:
    """A job Slurm (or an accounting export) says holds 2 GPUs on g1 without saying which: g1's unnamed GPUs are
    ``unplaced``, not ``none`` (the zombie rule's), and another node's stay ``none``. A job placed in full changes
    nothing; one that names no node at all makes every node's unnamed GPUs unplaced."""
    gpus = pd.concat([frame(["", "", "", ""]), frame(["", "", "", ""]).assign(host="g2")], ignore_index=True)
    running = {"state": "RUNNING", "start_ts": 0.0}
    somewhere_on_g1 = Job(job_id="9", user="bob", nodes=("g1",), gpus_requested=2, **running)  # type: ignore[arg-type]
    out, _ = attribute(gpus, [job("7", (0,), **running), somewhere_on_g1], [])
    assert out["attribution"].tolist() == ["slurm", "unplaced", "unplaced", "unplaced"] + ["none"] * 4
    assert out["job_id"].tolist()[1:] == [None] * 7
    out, _ = attribute(gpus, [job("7", (0, 1), gpus_requested=2, **running)], [])
    assert out["attribution"].tolist() == ["slurm", "slurm"] + ["none"] * 6
    nowhere = Job(job_id="9", user="bob", gpus_requested=1, **running)  # type: ignore[arg-type]
    out, _ = attribute(gpus, [nowhere], [])
    assert set(out["attribution"]) == {"unplaced"}


def test_a_host_the_scheduler_does_not_name_may_be_a_node_it_sees_no_series_for() -> None:
    """Jobs run on g1 and g2; the exporters name g1 and 10.0.0.2:9400 (g2 by its address). Attributed as "no job's",
    the address's GPUs would be zombies of g2's running job: they are ``unplaced`` while a node running GPU jobs
    has no series, and ``none`` again once every such node has one (or, with the scheduler's node list, when the
    address is a node it lists)."""
    from gpu_cost.core.model import Node
    from gpu_cost.perceive.correlate import unseen_nodes, unseen_problem

    running = {"state": "RUNNING", "start_ts": 0.0}
    gpus = pd.concat([frame(["", "", "", ""]), frame(["", "", "", ""]).assign(host="10.0.0.2:9400")],
                     ignore_index=True)
    on_g2 = Job(job_id="8", user="bob", gpu_alloc=(("g2", (0, 1)),), nodes=("g2",), **running)  # type: ignore[arg-type]
    jobs = [job("7", (0,), **running), on_g2]
    out, _ = attribute(gpus, jobs, [], unseen=unseen_nodes(gpus["host"], jobs))
    assert out["attribution"].tolist() == ["slurm", "none", "none", "none"] + ["unplaced"] * 4
    assert unseen_nodes(gpus["host"], jobs) == ["g2"]
    assert unseen_problem(["g2"]) == "no GPU series for node(s) running GPU jobs: g2 (exporter missing?)"
    # g2's job has ended: every node running GPU jobs is seen, and a stray host's GPUs are nobody's again
    out, _ = attribute(gpus, jobs[:1], [], unseen=unseen_nodes(gpus["host"], jobs[:1]))
    assert out["attribution"].tolist() == ["slurm"] + ["none"] * 7 and unseen_nodes(gpus["host"], jobs[:1]) == []
    # the scheduler's node list: what it says runs GPU jobs, and what it names
    listed = [Node(name="g1", gpus_alloc=1), Node(name="g2", gpus_alloc=2), Node(name="10.0.0.2:9400")]
    out, _ = attribute(gpus, jobs, [], listed, unseen=unseen_nodes(gpus["host"], jobs, listed))
    assert out["attribution"].tolist() == ["slurm", "none", "none", "none"] + ["none"] * 4
    assert unseen_nodes(gpus["host"], [], listed) == ["g2"]


def test_a_nodes_second_name_is_nobodys() -> None:
    """An exporter relabelled mid-trace names g1 both ``g1`` and ``g1.c.org``; the job on g1 uses both series'
    GPUs. The second name's GPUs are ``unplaced`` (maybe the job's), not zombies; an address no node is called
    stays ``none``, since every node running GPU jobs has its series."""
    from gpu_cost.perceive.correlate import aliases

    running = {"state": "RUNNING", "start_ts": 0.0}
    gpus = pd.concat([frame(["", "", "", ""]), frame(["", "", "", ""]).assign(host="g1.c.org"),
                      frame(["", "", "", ""]).assign(host="10.0.0.9")], ignore_index=True)
    out, _ = attribute(gpus, [job("7", (0,), **running)], [])
    assert out["attribution"].tolist() == ["slurm"] + ["none"] * 3 + ["unplaced"] * 4 + ["none"] * 4
    assert aliases({"g1", "g1.c.org", "G1:9400", "10.0.0.9", "g2"}, {"g1"}) == {"g1.c.org", "G1:9400"}


def test_a_label_naming_a_job_the_record_does_not_hold_is_nobodys_in_a_trace() -> None:
    """The exporter labels g1:1 with job 8, g1:2 with job 5; job 7 runs on g1:0. Live (``recorded`` None), Slurm
    lists every running job: 8 and 5 ended, their GPUs are no job's. In a trace whose jobs file holds 5 (ended)
    but not 8, g1:1 is ``unplaced`` (job 8 may still run) and g1:2 stays ``none``."""
    running = {"state": "RUNNING", "start_ts": 0.0}
    gpus = frame(["", "8", "5", ""])
    out, _ = attribute(gpus, [job("7", (0,), **running)], [])
    assert out["attribution"].tolist() == ["slurm", "none", "none", "none"]
    out, _ = attribute(gpus, [job("7", (0,), **running)], [], recorded=frozenset({"7", "5"}))
    assert out["attribution"].tolist() == ["slurm", "unplaced", "none", "none"]


def test_a_host_outside_the_scheduler_is_not_its_to_judge() -> None:
    """The same Prometheus scrapes g1, a Slurm node, and inf1, an inference server Slurm does not run; both hold
    memory in processes no job owns. Live, with Slurm's node list, inf1's GPUs are ``outside``: no rule judges
    them, their processes are nobody's zombies, and they are not the cluster's GPUs (a cap on a share of the
    cluster counts without them). g1's free GPUs stay ``none``. In a trace the nodes the jobs file names say the
    same; a record that names no node says nothing, and every host stays the scheduler's."""
    from gpu_cost.core.model import Node, Snapshot

    running = {"state": "RUNNING", "start_ts": 0.0}
    gpus = pd.concat([frame(["", "", "", ""]), frame(["", "", "", ""]).assign(host="inf1")], ignore_index=True)
    procs = [proc(1, 3, None), GpuProcess(host="inf1", pid=2, gpu_uuid="GPU-9", gpu=0, used_mib=9000.0, start_ts=1.0)]
    jobs = [job("7", (0,), **running)]
    out, _ = attribute(gpus, jobs, procs, [Node(name="g1", gpus_total=4)])
    assert out["attribution"].tolist() == ["slurm", "none", "none", "none"] + ["outside"] * 4
    out, _ = attribute(gpus, jobs, procs, managed=frozenset({"g1"}))
    assert out["attribution"].tolist() == ["slurm", "none", "none", "none"] + ["outside"] * 4
    out, _ = attribute(gpus, jobs, procs)  # nothing names the scheduler's nodes: every host is its
    assert out["attribution"].tolist() == ["slurm"] + ["none"] * 7
    # a running job's node is the scheduler's, whatever the node list forgot
    out, _ = attribute(gpus, [*jobs, Job(job_id="8", user="bob", gpu_alloc=(("inf1", (0,)),), nodes=("inf1",),
                                         **running)], procs, [Node(name="g1", gpus_total=4)])  # type: ignore[arg-type]
    assert out["attribution"].tolist()[4:] == ["slurm", "none", "none", "none"]
    out, _ = attribute(gpus, jobs, procs, [Node(name="g1", gpus_total=4)])
    snap = Snapshot(ts=0.0, window_s=60.0, lookback_s=60.0, source="test", gpus=out, jobs=tuple(jobs))
    assert snap.gpu_count() == 4 == Snapshot.gpu_count_of_json(snap.to_json())


def test_the_live_node_list_takes_no_host_outside_the_scheduler() -> None:
    """Live, Slurm's node list is merged with the GPU hosts (a host Slurm's list misses while it is down still
    gets a node). A host outside the scheduler gets none: its GPUs would count as the cluster's in every cap, and
    an idle-node rule would judge it."""
    from gpu_cost.core.model import Node
    from gpu_cost.perceive.live import _merge_nodes

    gpus = pd.DataFrame({"host": ["g1", "g1", "inf1", "inf1"], "gpu": [0, 1, 0, 1], "model": ["a100"] * 4,
                         "power_w": [100.0] * 4, "uuid": [f"GPU-{i}" for i in range(4)], "label_job_id": [""] * 4})
    out, _ = attribute(gpus, [job("7", (0,))], [], nodes=[Node("g1", gpus_total=2)])
    assert out["attribution"].tolist() == ["slurm", "none", "outside", "outside"]
    assert [n.name for n in _merge_nodes([Node("g1", gpus_total=2)], out, {})] == ["g1"]
    # Slurm down (no node list): every GPU host is a node, as before
    bare, _ = attribute(gpus, [], [])
    assert [(n.name, n.gpus_total) for n in _merge_nodes([], bare, {})] == [("g1", 2), ("inf1", 2)]


@pytest.mark.parametrize("live", [True, False], ids=["live", "trace"])
def test_what_a_sweep_does_not_see_degrades_it_the_same_way_live_and_in_a_trace(live: bool) -> None:
    """g1 is the scheduler's node, inf1 an inference server outside it. inf1's exporter stopping says nothing about
    the cluster; every g1 series stale is a problem either way; some of them stale degrades a live sweep (an
    exporter stopped: part of the cluster unseen) but not a trace's (a gap there leaves those GPUs unjudged). A node
    running GPU jobs with no series is a problem, unless a trace's samples cover part of its cluster."""
    from gpu_cost.perceive.correlate import sight_problems

    gpus = pd.concat([frame(["", "", "", ""]), frame(["", "", "", ""]).assign(host="inf1")], ignore_index=True)
    gpus["attribution"] = ["slurm", "none", "none", "none"] + ["outside"] * 4

    def problems(stale: list[bool], unseen: list[str] = [], managed: frozenset[str] | None = None) -> list[str]:
        return sight_problems(gpus.assign(stale=stale), unseen, live=live, managed=managed)

    assert problems([False] * 8) == []
    assert problems([False] * 4 + [True] * 4) == []  # outside the cluster
    assert problems([True] * 4 + [False] * 4) == ["every GPU series is stale or missing"]
    assert problems([True] * 8) == ["every GPU series is stale or missing"]
    part = problems([False, True, False, False] + [True] * 4)
    assert part == (["stale or missing GPU series: 1 of 4 GPUs (on g1)"] if live else [])
    unseen = "no GPU series for node(s) running GPU jobs: g2 (exporter missing?)"
    assert problems([False] * 8, ["g2"]) == [unseen]
    # a trace whose samples name only hosts its jobs file names covers part of the cluster: g2 is not seen, for good
    assert problems([False] * 8, ["g2"], frozenset({"g1", "g2", "inf1"})) == []
    assert problems([False] * 8, ["g2"], frozenset({"g1", "g2"})) == [unseen]  # inf1 may be g2 by another name
    assert sight_problems(gpus.iloc[:0].assign(stale=[]), [], live=live) == []
