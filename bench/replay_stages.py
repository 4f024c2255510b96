"""Benchmark: where a replay's time goes, stage by stage, and how much of it is the audit store.

Runs ``replay`` in this process on a cached ``sim-trace`` (the same traces as :mod:`bench.replay`) with a
timer around each stage of a sweep — the snapshot, the class baselines, the rules, the plan (the ladder's
episodes and the engine), recording it, the usage rows, the act step, the log tails and processes — and
around every call into the audit store (each :class:`~gpu_cost.audit.store.AuditStore` method and the act
step's effect guard, counted once however they nest), booked to the stage that made it.

What it answers: which part of a sweep is per GPU and job (what deciding a block of instants at once as
arrays can shrink) and which part is per decision and per audit row (the ladder, the act step and the
rows the audit store keeps: sequential, and the same rows whatever computes the findings). The second is
printed as ``per_decision_and_row_s`` (the per-decision stages whole, and the store's calls of the others);
``store_writes_s`` is the store's writing calls alone: the least any engine spends on the trace while it
writes the same audit rows through the same store, one statement at a time as today. ``driver_floor_s`` is
less still: the rows the replay's store holds at its end (``rows_kept``) written again into an empty store of
the same schema and settings by the bare SQLite driver, every table in one statement and all in one transaction
(the class members' rows once each, though every sweep rewrote its running jobs' rows): what any engine that keeps
the same audit rows spends in SQLite alone, however it batches them. Nothing is asserted; the figures are for
reading.

    python -m bench.replay_stages [--gpus 1000] [--days 1] [--cache .gpu_cost/bench-traces]
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench._common import report
from bench.replay import ROOT, trace

#: (label, module, attribute): the stages of one replayed sweep, each a function the replay calls by its module
STAGES = (
    ("snapshot", "gpu_cost.perceive.snapshot", "from_matrix"),
    ("class baselines", "gpu_cost.analyse.baselines", "observe"),
    ("rules", "gpu_cost.analyse.rules", "run_rules"),
    ("plan", "gpu_cost.loop.sweep", "plan"),
    ("record", "gpu_cost.loop.sweep", "record"),
    ("usage rows", "gpu_cost.report.usage", "record_usage"),
    ("act", "gpu_cost.sim.replay", "_Replay._act"),
    ("log tails", "gpu_cost.sim.replay", "_Replay._logs_at"),
    ("processes", "gpu_cost.sim.replay", "_Replay._procs_at"),
)
#: stages whose work is per decision (the ladder, the caps, the act step): sequential in any engine
PER_DECISION = ("plan", "record", "act")
#: the audit store's methods that only read (an engine could keep what they answer in memory); every other
#: entry point writes rows (and the act step's effect guard writes the action's first row)
READS = frozenset({"fetch", "query", "scan", "get_run", "load_snapshot", "get_decision", "decisions_of_run",
                   "decisions_by_ids", "decision_events", "get_action", "actions_of_decision", "escalation",
                   "open_escalations", "active_snoozes", "table_counts", "schema_state", "ping", "ensure_schema",
                   "path"})


class Clock:
    """Seconds per stage, and the audit store's seconds and calls within each (the outermost call counts)."""

    def __init__(self) -> None:
        self.stage_s: dict[str, float] = {}
        self.store_s: dict[str, float] = {}
        self.store_calls: dict[str, int] = {}
        #: seconds in the store's writing entry points, every stage together
        self.write_s = 0.0
        self._stage: list[str] = []
        self._in_store = 0

    def stage(self, label: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            self._stage.append(label)
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self._stage.pop()
                if label not in self._stage:  # a stage inside itself counts once
                    self.stage_s[label] = self.stage_s.get(label, 0.0) + time.perf_counter() - t0
        return timed

    def store(self, fn: Callable[..., Any], writes: bool) -> Callable[..., Any]:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if self._in_store:
                return fn(*args, **kwargs)
            self._in_store += 1
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self._in_store -= 1
                where = self._stage[-1] if self._stage else "other"
                self.store_s[where] = self.store_s.get(where, 0.0) + time.perf_counter() - t0
                self.store_calls[where] = self.store_calls.get(where, 0) + 1
                if writes:
                    self.write_s += time.perf_counter() - t0
        return timed


def instrument(clock: Clock) -> None:
    """Wrap the stages and the audit store's entry points of this process (a benchmark's own process only)."""
    import importlib

    from gpu_cost.act import locks
    from gpu_cost.audit.store import AuditStore

    for label, module, attr in STAGES:
        owner: Any = importlib.import_module(module)
        *path, name = attr.split(".")
        for part in path:
            owner = getattr(owner, part)
        setattr(owner, name, clock.stage(label, getattr(owner, name)))
    for name, fn in list(vars(AuditStore).items()):
        if callable(fn) and not name.startswith("__") and not isinstance(fn, (staticmethod, classmethod)):
            setattr(AuditStore, name, clock.store(fn, writes=name not in READS))
    locks.start_effect = clock.store(locks.start_effect, writes=True)


def driver_floor(path: str) -> tuple[int, float]:
    """Return ``(rows, seconds)``: the rows of the SQLite store at ``path``, and the time the bare driver takes to
    write them again into an empty store of the same schema (the replay's store settings: journal in memory, no
    sync), a table in one ``executemany`` and every table in one transaction."""
    import sqlite3
    import tempfile

    from gpu_cost.audit.store import schema_statements

    src = sqlite3.connect(path)
    data: dict[str, tuple[list[str], list[Any]]] = {}
    for (table,) in src.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE 'gpu_cost_%'"):
        rows = src.execute(f'SELECT * FROM "{table}"').fetchall()
        if rows:
            data[table] = ([c[1] for c in src.execute(f'PRAGMA table_info("{table}")')], rows)
    src.close()
    with tempfile.TemporaryDirectory(prefix="gpu-cost-floor-") as tmp:
        con = sqlite3.connect(str(Path(tmp) / "floor.db"))
        con.execute("PRAGMA journal_mode=MEMORY")
        con.execute("PRAGMA synchronous=OFF")
        for statement in schema_statements("sqlite"):
            con.execute(statement)
        con.commit()
        made = {name for (name,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        data = {table: found for table, found in data.items() if table in made}  # not the migrations' own table
        t0 = time.perf_counter()
        for table, (columns, rows) in data.items():
            names = ", ".join(f'"{c}"' for c in columns)
            con.executemany(f'INSERT INTO "{table}" ({names}) VALUES ({", ".join("?" * len(columns))})', rows)
        con.commit()
        seconds = time.perf_counter() - t0
        con.close()
    return sum(len(rows) for _, rows in data.values()), seconds


def one(cache: Path, gpus: int, days: float) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    from gpu_cost.audit.store import AuditStore
    from gpu_cost.config.loader import load_policy
    from gpu_cost.sim.replay import replay_files

    info = trace(cache, gpus, days)
    clock = Clock()
    instrument(clock)
    store = AuditStore.scratch()  # the replay's own kind of store, kept here to count its rows after
    t0 = time.perf_counter()
    res = replay_files(info["samples"], info["jobs_file"], load_policy(), mode="enforce", store=store).to_dict()
    wall = time.perf_counter() - t0
    assert store.path is not None
    rows_kept, floor_s = driver_floor(store.path)
    sweeps = max(1, int(res["sweeps"]))
    actions = len(res["actions"])
    rows = []
    for label, _, _ in STAGES:
        s = clock.stage_s.get(label, 0.0)
        rows.append({"stage": label, "s": s, "ms_per_sweep": 1000 * s / sweeps, "share": s / wall,
                     "store_s": clock.store_s.get(label, 0.0), "store_calls": clock.store_calls.get(label, 0)})
    staged = sum(clock.stage_s.values())
    rows.append({"stage": "rest (set-up, ledger, outcomes)", "s": wall - staged, "ms_per_sweep": 1000 * (wall - staged) / sweeps,
                 "share": (wall - staged) / wall, "store_s": clock.store_s.get("other", 0.0),
                 "store_calls": clock.store_calls.get("other", 0)})
    store_s = sum(clock.store_s.values())
    floor = (sum(clock.stage_s.get(k, 0.0) for k in PER_DECISION)
             + sum(v for k, v in clock.store_s.items() if k not in PER_DECISION))
    summary = {"gpus": res["gpus"], "days": days, "sweeps": sweeps, "actions": actions, "decisions": sum(res["decisions"].values()),
               "wall_s": wall, "ms_per_sweep": 1000 * wall / sweeps, "store_s": store_s, "store_share": store_s / wall,
               "store_writes_s": clock.write_s, "store_writes_share": clock.write_s / wall,
               "act_ms_per_action": 1000 * clock.stage_s.get("act", 0.0) / max(1, actions),
               "per_decision_and_row_s": floor, "per_decision_and_row_share": floor / wall,
               "rows_kept": rows_kept, "driver_floor_s": floor_s, "driver_floor_share": floor_s / wall,
               "kills": res["kills"], "false_kills": res["false_kills"]}
    return rows, summary


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gpus", type=int, default=1000, help="trace size in GPUs (rounded up to whole 8-GPU nodes)")
    ap.add_argument("--days", type=float, default=1.0)
    ap.add_argument("--cache", default=str(ROOT / ".gpu_cost" / "bench-traces"), help="where traces are kept")
    args = ap.parse_args(argv)
    cache = Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    rows, summary = one(cache, args.gpus, args.days)
    report("replay stages", rows, ["stage", "s", "ms_per_sweep", "share", "store_s", "store_calls"])
    report("replay floor", [summary], list(summary))


if __name__ == "__main__":
    main(sys.argv[1:])
