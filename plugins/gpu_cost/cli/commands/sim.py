"""``gpu-cost sim``: simulated GPUs for real servers.

- ``gpu-cost sim serve``: a dcgm-exporter-format endpoint for a scenario, or for the jobs that
  really run on Slurm (``--slurm``);
- ``gpu-cost sim backfill``: the same series for a past range as OpenMetrics, for
  ``promtool tsdb create-blocks-from openmetrics``;
- ``gpu-cost sim nvidia-smi-state`` / ``gpu-cost sim nvidia-smi``: the state file the fake
  ``nvidia-smi`` (``include/sim/nvidia-smi``) prints, or nvidia-smi's output itself.
"""

from __future__ import annotations

import argparse
import importlib.machinery
import importlib.util
import json
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from gpu_cost.cli.options import add_json, duration_arg, instant_arg
from gpu_cost.core import paths
from gpu_cost.core.errors import GpuCostError
from gpu_cost.core.timeutil import iso


def register(sub: Any) -> None:
    p = sub.add_parser("sim", help="simulated GPUs for real servers (exporter, history, fake nvidia-smi)")
    psub = p.add_subparsers(dest="sim_command", required=True)

    s = psub.add_parser("serve", help="serve the GPUs in dcgm-exporter's format until stopped")
    s.add_argument("--scenario", help="scenario file (default: the shipped one)")
    s.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    s.add_argument("--port", type=int, default=9400, help="port (default 9400, dcgm-exporter's)")
    s.add_argument("--slurm", action="store_true", help="drive the GPUs by the jobs running on Slurm")
    s.add_argument("--nodes", help="--slurm: GPU nodes as NAME:GPUS[,NAME:GPUS] (default: from Slurm)")
    s.add_argument("--model", default="a100", help="--slurm: GPU model of the nodes (default a100)")
    s.add_argument("--sample-interval", default="5s", help="--slurm: sample grid (default 5s)")
    s.add_argument("--hostname-domain", default="",
                   help="a DNS domain the Hostname label carries after each node's name, as on nodes whose "
                        "hostname is fully qualified (default: the name alone)")
    add_json(s)
    s.set_defaults(handler=_serve)

    b = psub.add_parser("backfill", help="write a scenario's series for a past range as OpenMetrics")
    b.add_argument("--scenario", help="scenario file (default: the shipped one)")
    b.add_argument("--start", required=True, help="range start: ISO 8601, epoch, or a duration before --end (6h)")
    b.add_argument("--end", help="range end (ISO 8601 or epoch; default now)")
    b.add_argument("--label", action="append", default=[], metavar="NAME=VALUE",
                   help="extra label on every series, e.g. job=dcgm instance=host:9400 (repeatable)")
    b.add_argument("--out", required=True, help="output file")
    add_json(b)
    b.set_defaults(handler=_backfill)

    st = psub.add_parser("nvidia-smi-state", help="write the fake nvidia-smi's state for one node of a scenario")
    st.add_argument("--scenario", help="scenario file (default: the shipped one)")
    st.add_argument("--host", required=True, help="node name")
    st.add_argument("--at", help="instant (ISO 8601 or epoch; default now)")
    st.add_argument("--out", required=True, help="state file (JSON)")
    add_json(st)
    st.set_defaults(handler=_state)

    n = psub.add_parser("nvidia-smi", help="print what nvidia-smi would print on a node of a scenario")
    n.add_argument("--scenario", help="scenario file (default: the shipped one)")
    n.add_argument("--node", required=True, help="node name")
    n.add_argument("--at", help="instant (ISO 8601 or epoch; default now)")
    n.add_argument("args", nargs=argparse.REMAINDER, help="nvidia-smi arguments (after --)")
    n.set_defaults(handler=_nvidia_smi)


def _scenario(path: str | None) -> Any:
    from gpu_cost.sim.cluster import load_scenario

    return load_scenario(path)


def _nodes_arg(text: str, model: str) -> list[Any]:
    from gpu_cost.sim.cluster import SimNode

    out = []
    for part in text.split(","):
        name, _, count = part.strip().partition(":")
        if not name or not count.isdigit():
            raise GpuCostError(f"--nodes: {part!r} is not NAME:GPUS")
        out.append(SimNode(name=name, gpus=int(count), model=model))
    return out


def _slurm_feed(args: argparse.Namespace) -> Any:
    from gpu_cost.perceive.slurm import SlurmSource
    from gpu_cost.sim.cluster import SimNode
    from gpu_cost.sim.exporter import SlurmFeed

    source = SlurmSource()
    if args.nodes:
        nodes = _nodes_arg(args.nodes, args.model)
    else:
        nodes = [SimNode(name=n.name, gpus=n.gpus_total, model=n.gpu_model or args.model) for n in source.nodes() if n.gpus_total]
        if not nodes:
            raise GpuCostError("Slurm lists no GPU nodes: pass --nodes NAME:GPUS,...")
    return SlurmFeed(nodes, source.jobs, sample_interval=duration_arg(args.sample_interval, "--sample-interval"))


def _serve(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    from gpu_cost.sim.exporter import ScenarioFeed, serve

    feed = _slurm_feed(args) if args.slurm else ScenarioFeed(_scenario(args.scenario))
    server, _thread = serve(feed, args.host, args.port, domain=args.hostname_domain.strip("."))
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    ready = {"url": f"http://{args.host}:{args.port}/metrics", "mode": "slurm" if args.slurm else "scenario",
             "started": time.time()}
    sys.stdout.write((json.dumps(ready) if args.json else f"serving {ready['url']} ({ready['mode']})") + "\n")
    sys.stdout.flush()
    stop.wait()
    server.shutdown()
    raise SystemExit(0)


def _backfill(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    from gpu_cost.sim.cluster import SimCluster, resolve_anchor
    from gpu_cost.sim.exporter import openmetrics_history

    end = instant_arg(args.end, "--end") if args.end else time.time()
    start = instant_arg(args.start, "--start", before=end)
    if start >= end:
        raise GpuCostError(f"--start {args.start} is not before --end")
    labels = {}
    for item in args.label:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise GpuCostError(f"--label {item!r} is not NAME=VALUE")
        labels[key] = value
    sc = _scenario(args.scenario)
    cluster = SimCluster(sc, anchor=resolve_anchor(sc.anchor, end))
    lines = 0
    out = Path(args.out)
    with out.open("w", encoding="utf-8") as fh:
        for line in openmetrics_history(cluster, start, end, labels):
            fh.write(line + "\n")
            lines += 1
    payload = {"out": str(out), "start": start, "end": end, "lines": lines, "gpus": sc.gpu_count}
    return payload, f"wrote {lines} lines ({sc.gpu_count} GPUs, {iso(start)} → {iso(end)}) to {out}"


def _host_state(args: argparse.Namespace, host: str) -> dict[str, Any]:
    """Return what nvidia-smi would show on ``host`` of the scenario at ``--at`` (default now)."""
    from gpu_cost.sim.cluster import SimCluster
    from gpu_cost.sim.exporter import nvidia_smi_state

    at = instant_arg(args.at, "--at") if args.at else time.time()
    try:
        return nvidia_smi_state(SimCluster(_scenario(args.scenario), anchor=at), host, at)
    except ValueError as exc:
        raise GpuCostError(str(exc)) from None


def _state(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    state = _host_state(args, args.host)
    Path(args.out).write_text(json.dumps(state, indent=1), encoding="utf-8")
    return {"out": args.out, "gpus": len(state["gpus"]), "processes": len(state["processes"])}, \
        f"wrote {args.out}: {len(state['gpus'])} GPUs, {len(state['processes'])} processes"


def load_fake_nvidia_smi() -> Any:
    """Import ``include/sim/nvidia-smi`` (a standalone script) as a module."""
    path = paths.include_dir() / "sim" / "nvidia-smi"
    loader = importlib.machinery.SourceFileLoader("gpu_cost_fake_nvidia_smi", str(path))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    if spec is None:
        raise GpuCostError(f"{path}: cannot be loaded")
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def _nvidia_smi(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    state = _host_state(args, args.node)
    argv = [a for a in args.args if a != "--"] if args.args[:1] == ["--"] else list(args.args)
    rc, out, err = load_fake_nvidia_smi().render(argv, state)
    sys.stdout.write(out)
    sys.stderr.write(err)
    sys.stdout.flush()
    raise SystemExit(rc)
