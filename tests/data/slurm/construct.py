"""Write the per-version Slurm JSON answers of this folder (23.02 ... 25.11), constructed, not captured.

    .venv/bin/python -m tests.data.slurm.construct

No Slurm newer than 22.05 runs on the test machines (Debian 12 ships 22.05), so these answers are
*constructed*: one invented cluster state (the same jobs and nodes for every version), written in
each version's shapes as ``src/plugins/data_parser/<v>/parsers.c`` of SchedMD/slurm dumps them at
the release tag named in :data:`VERSIONS` (field names, nesting, which numbers are
``{"set", "infinite", "number"}`` objects, which states are lists). Only the fields the agent
reads plus a few neighbours are written; README.md beside this file lists what each file holds.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

#: Slurm release → (data_parser version, SchedMD/slurm tag, commit the shapes were read at)
VERSIONS: dict[str, tuple[str, str, str]] = {
    "23.02": ("v0.0.39", "slurm-23-02-7-1", "7d4666c7d539fb056399b898f1b82f2e2bb20bb1"),
    "23.11": ("v0.0.40", "slurm-23-11-10-1", "d3e78848f72745ceb80e2a6bebdbcf3cfd7462b1"),
    "24.05": ("v0.0.41", "slurm-24-05-8-1", "46879dc2d172fd362745d21730a6846888d10157"),
    "24.11": ("v0.0.42", "slurm-24-11-7-1", "defaf214db2e55326f45ab08f1bde5b2036d9f5d"),
    "25.05": ("v0.0.43", "slurm-25-05-8-1", "90ff1dd4058b3ec2df25306a3917650efa59537f"),
    "25.11": ("v0.0.44", "slurm-25-11-7-1", "f56e676bbd3e7cccbdd7c505c030c62bb983ebee"),
}
T0 = 1764700000  # 2025-12-02T18:26:40Z

# -- the invented cluster state -------------------------------------------------------------------
JOBS: list[dict[str, Any]] = [
    {"id": 7001, "name": "train-llm", "user": "alice", "account": "nlp", "state": "RUNNING", "nodes": "gpu01",
     "alloc": [("gpu01", 4)], "gres": ["gpu:a100:2(IDX:0-1)"], "gpus": 2, "limit": 120, "start": T0 - 3600,
     "comment": "gpu-cost:no-interrupt", "priority": 4294901000, "nice": 0, "sluid": "s0k2x7d9q4m1ab"},
    {"id": 7002, "name": "ddp", "user": "bob", "account": "vision", "state": "RUNNING", "nodes": "gpu[01-02]",
     "alloc": [("gpu01", 2), ("gpu02", 2)], "gres": ["gpu:a100:1(IDX:2)", "gpu:a100:1(IDX:0)"], "gpus": 2,
     "limit": 60, "start": T0 - 600, "comment": "", "priority": 4294900990, "nice": 100, "sluid": "s0k2x7d9q4m1ac"},
    {"id": 7005, "array": (7003, 2), "name": "sweep", "user": "carol", "account": "nlp", "state": "RUNNING",
     "nodes": "gpu02", "alloc": [("gpu02", 1)], "gres": ["gpu:a100:1(IDX:3)"], "gpus": 1, "limit": 30,
     "start": T0 - 300, "comment": "", "priority": 4294900980, "nice": 0, "sluid": "s0k2x7d9q4m1ad"},
    {"id": 7010, "name": "queued", "user": "dave", "account": "vision", "state": "PENDING", "nodes": "",
     "alloc": [], "gres": [], "gpus": 4, "limit": None, "start": 0, "comment": "", "priority": 4294900970,
     "nice": 0, "sluid": "s0k2x7d9q4m1ae"},
]
FINISHED: list[dict[str, Any]] = [
    {"id": 6990, "name": "finetune", "user": "alice", "account": "nlp", "state": "COMPLETED", "nodes": "gpu01",
     "gpus": 2, "limit": 480, "start": T0 - 20000, "end": T0 - 4000, "comment": "gpu-cost:inference"},
    {"id": 6991, "name": "oom", "user": "bob", "account": "vision", "state": "CANCELLED", "nodes": "gpu02",
     "gpus": 1, "limit": 60, "start": T0 - 9000, "end": T0 - 8000, "comment": ""},
]
NODES: list[dict[str, Any]] = [
    {"name": "gpu01", "state": ["MIXED"], "gres": "gpu:a100:4(S:0-1)", "used": "gpu:a100:3(IDX:0-2)"},
    {"name": "gpu02", "state": ["MIXED"], "gres": "gpu:a100:4(S:0-1)", "used": "gpu:a100:2(IDX:0,3)"},
    {"name": "gpu03", "state": ["IDLE", "POWERED_DOWN"], "gres": "gpu:a100:4(S:0-1)", "used": "gpu:a100:0(IDX:N/A)"},
    {"name": "gpu04", "state": ["IDLE", "DRAIN"], "gres": "gpu:a100:4(S:0-1)", "used": "gpu:a100:0(IDX:N/A)",
     "reason": "xid 79"},
]


# -- version shapes ---------------------------------------------------------------------------------
def no_val(n: float | None, *, infinite: bool = False) -> dict[str, Any]:
    """``UINT32_NO_VAL`` / ``TIMESTAMP_NO_VAL`` as every data_parser since v0.0.39 dumps them."""
    return {"set": n is not None and not infinite, "infinite": infinite, "number": 0 if n is None else n}


def _v(release: str) -> int:
    return int(VERSIONS[release][0].rsplit(".", 1)[1])


def meta(release: str, command: list[str], plugin: str = "") -> dict[str, Any]:
    v = VERSIONS[release][0]
    major, minor = release.split(".")
    dp = v if _v(release) == 39 else f"data_parser/{v}"
    return {"plugin": {"type": plugin, "name": "", "data_parser": dp, "accounting_storage": "accounting_storage/slurmdbd"},
            "client": {"source": "/dev/pts/0", "user": "gpucost", "group": "gpucost"}, "command": command,
            "slurm": {"version": {"major": major, "micro": "1", "minor": minor}, "release": f"{release}.1",
                      "cluster": "gpucost"}}


def squeue_job(release: str, j: dict[str, Any]) -> dict[str, Any]:
    v = _v(release)
    ts = (lambda n: n) if v == 39 else (lambda n: no_val(n if n else None))  # UINT64 in v0.0.39
    array_job, task = j.get("array", (0, None))
    d: dict[str, Any] = {
        "account": j["account"], "accrue_time": ts(j["start"] - 60 if j["start"] else T0 - 60),
        "array_job_id": no_val(array_job), "array_task_id": no_val(task), "array_max_tasks": no_val(0),
        "array_task_string": "", "batch_flag": True, "batch_host": j["nodes"].split("[")[0] + ("01" if "[" in j["nodes"] else ""),
        "cluster": "gpucost", "command": f"/home/{j['user']}/run.sh", "comment": j["comment"],
        "end_time": ts(j["start"] + 60 * j["limit"] if j["start"] and j["limit"] else 0),
        "flags": ["USING_DEFAULT_QOS"], "gres_detail": list(j["gres"]), "group_name": j["user"],
        "job_id": j["id"], "name": j["name"], "nodes": j["nodes"], "nice": j["nice"],
        "node_count": no_val(max(1, len(j["alloc"]))), "partition": "gpu",
        "priority": no_val(j["priority"]), "qos": "normal", "resv_name": "",
        "start_time": ts(j["start"]), "submit_time": ts(j["start"] - 120 if j["start"] else T0 - 120),
        "time_limit": no_val(j["limit"], infinite=j["limit"] is None),
        "tres_per_node": f"gres/gpu:{j['gpus']}" if not j["alloc"] else f"gres/gpu:{j['gpus'] // max(1, len(j['alloc']))}",
        "tres_req_str": f"cpu={2 * j['gpus']},mem=16000M,node=1,billing=2,gres/gpu={j['gpus']}",
        "tres_alloc_str": (f"cpu={2 * j['gpus']},mem=16000M,node={len(j['alloc'])},billing=2,gres/gpu={j['gpus']}"
                           if j["alloc"] else ""),
        "user_name": j["user"], "user_id": 1000 + JOBS.index(j),
    }
    d["job_state"] = j["state"] if v == 39 else [j["state"]]
    if j["alloc"]:
        if v <= 40:  # JOB_RES of v0.0.39/v0.0.40: "allocated_nodes" with "nodename"
            d["job_resources"] = {"nodes": j["nodes"], "allocated_cores": 2 * j["gpus"], "allocated_cpus": 2 * j["gpus"],
                                  "allocated_hosts": len(j["alloc"]),
                                  "allocated_nodes": [{"sockets": {"0": {"cores": {"0": "allocated"}}}, "cores": {},
                                                       "memory": 16000, "cpus": c, "nodename": n} for n, c in j["alloc"]]}
        else:  # v0.0.41+: "nodes" object with "allocation" entries carrying "name"
            d["job_resources"] = {"select_type": ["CR_CORE", "CR_MEMORY"], "cpus": 2 * j["gpus"],
                                  "threads_per_core": no_val(1),
                                  "nodes": {"count": len(j["alloc"]), "select_type": ["AVAILABLE"], "list": j["nodes"],
                                            "whole": False,
                                            "allocation": [{"index": i, "name": n, "cpus": {"count": c, "used": 0},
                                                            "memory": {"used": 0, "allocated": 16000},
                                                            "sockets": [{"index": 0, "cores": [{"index": 0, "status": ["ALLOCATED"]}]}]}
                                                           for i, (n, c) in enumerate(j["alloc"])]}}
    else:
        d["job_resources"] = {} if v > 40 else None
    if v >= 42:
        d["priority_by_partition"] = []
    if v >= 43:
        d["licenses_allocated"] = ""
        d["segment_size"] = 0
    if v >= 44:  # 25.11: SLURM_STEP_ID with the job's SLUID
        d["step_id"] = {"sluid": j["sluid"], "job_id": no_val(j["id"]), "step_het_component": no_val(None),
                        "step_id": "TBD"}
        d["submit_line"] = f"sbatch --gres=gpu:{j['gpus']} run.sh"
    return d


def node(release: str, n: dict[str, Any]) -> dict[str, Any]:
    v = _v(release)
    used_cpus = 8 if n["state"] == ["MIXED"] else 0
    d: dict[str, Any] = {
        "architecture": "x86_64", "boards": 1, "boot_time": no_val(T0 - 86400) if v >= 40 else T0 - 86400,
        "cluster_name": "gpucost", "cores": 32, "cpus": 64, "features": ["a100"], "active_features": ["a100"],
        "gres": n["gres"], "gres_drained": "N/A", "gres_used": n["used"], "name": n["name"], "address": n["name"],
        "hostname": n["name"], "state": list(n["state"]), "partitions": ["gpu"], "port": 6818, "real_memory": 512000,
        "reason": n.get("reason", ""), "alloc_cpus": used_cpus, "alloc_idle_cpus": 64 - used_cpus,
        "tres_used": f"cpu={used_cpus}" + (",gres/gpu=2" if used_cpus else ""), "version": f"{release}.1",
    }
    if v >= 41:
        d["res_cores_per_gpu"] = 0
    if v >= 43:
        d["topology"] = ""
    return d


def sinfo_group(release: str, n: dict[str, Any]) -> dict[str, Any]:
    # sinfo --json groups nodes; a real one may put several nodes in a group: gpu01 and gpu02 share one here
    return {"port": 6818, "node": {"state": list(n["state"])},
            "nodes": {"allocated": 0, "idle": 0, "other": 0, "total": len(n["names"]), "hostnames": list(n["names"]),
                      "addresses": list(n["names"]), "nodes": list(n["names"])},
            "cpus": {"allocated": 0, "idle": 64, "other": 0, "total": 64, "minimum": 64, "maximum": 64},
            "gres": {"total": n["gres"], "used": n["used"]}, "cluster": "gpucost", "comment": "", "extra": "",
            "reason": {"description": n.get("reason", ""), "time": no_val(0), "user": ""}, "reservation": "",
            "partition": {"name": "gpu", "nodes": {"configured": "gpu[01-04]", "total": 4}}}


def sacct_job(release: str, j: dict[str, Any]) -> dict[str, Any]:
    v = _v(release)
    return {
        "account": j["account"], "comment": {"administrator": "", "job": j["comment"], "system": ""},
        "allocation_nodes": 1, "array": {"job_id": 0, "limits": {"max": {"running": {"tasks": 0}}},
                                         "task_id": no_val(None), "task": ""},
        "association": {"account": j["account"], "cluster": "gpucost", "partition": "", "user": j["user"], "id": 7},
        "cluster": "gpucost", "group": j["user"], "job_id": j["id"], "name": j["name"], "nodes": j["nodes"],
        "partition": "gpu", "qos": "normal",
        "state": {"current": j["state"] if v == 39 else [j["state"]], "reason": "None"},
        "time": {"elapsed": j["end"] - j["start"], "eligible": j["start"] - 60, "end": j["end"], "start": j["start"],
                 "submission": j["start"] - 60, "suspended": 0, "limit": no_val(j["limit"]),
                 "system": {"seconds": 1, "microseconds": 0}, "total": {"seconds": 2, "microseconds": 0},
                 "user": {"seconds": 1, "microseconds": 0}},
        "tres": {"allocated": [{"type": "cpu", "name": "", "id": 1, "count": 2 * j["gpus"]},
                               {"type": "mem", "name": "", "id": 2, "count": 16000},
                               {"type": "node", "name": "", "id": 4, "count": 1},
                               {"type": "gres", "name": "gpu", "id": 1001, "count": j["gpus"]}],
                 "requested": [{"type": "gres", "name": "gpu", "id": 1001, "count": j["gpus"]}]},
        "user": j["user"], "wckey": {"wckey": "", "flags": []}, "steps": [],
    }


def documents(release: str) -> dict[str, dict[str, Any]]:
    v = _v(release)
    sinfo_nodes = [{**NODES[0], "names": ["gpu01", "gpu02"]}, {**NODES[2], "names": ["gpu03"]},
                   {**NODES[3], "names": ["gpu04"]}]
    base = {"warnings": [], "errors": []}
    return {
        "squeue.json": {"jobs": [squeue_job(release, j) for j in JOBS], "last_backfill": no_val(T0 - 30),
                        "last_update": no_val(T0 - 5), "meta": meta(release, ["squeue", "--json"]), **base},
        "nodes.json": {"nodes": [node(release, n) for n in NODES], "last_update": no_val(T0 - 5),
                       "meta": meta(release, ["scontrol", "show", "nodes", "--json"]), **base},
        "sinfo.json": {"sinfo": [sinfo_group(release, n) for n in sinfo_nodes],
                       "meta": meta(release, ["sinfo", "--json"]), **base},
        "sacct.json": {"jobs": [sacct_job(release, j) for j in FINISHED],
                       "meta": meta(release, ["sacct", "--json"], "openapi/slurmdbd" if v >= 40 else ""), **base},
    }


def main() -> None:
    for release in VERSIONS:
        out = HERE / release
        out.mkdir(exist_ok=True)
        for name, doc in documents(release).items():
            (out / name).write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
