"""Off-hours power planning: windows (time zones, DST), idle candidates, reserve, caps, waking."""

from __future__ import annotations

import dataclasses
import datetime as dt
import time
from zoneinfo import ZoneInfo

import pandas as pd
import pytest
import time_machine

from gpu_cost.capacity.offhours import in_window, plan_power, savings_rows, vet_power_down
from gpu_cost.config.schema import Match, OffhoursConfig, Policy, Protection, Window
from gpu_cost.core.errors import PolicyError
from gpu_cost.core.model import GPU_COLUMNS, GpuProcess, Job, Node, Snapshot

BERLIN = ZoneInfo("Europe/Berlin")


def at(y, mo, d, h, mi=0, tz=BERLIN) -> float:
    return dt.datetime(y, mo, d, h, mi, tzinfo=tz).timestamp()


def cfg(**kw) -> OffhoursConfig:
    return dataclasses.replace(OffhoursConfig(), **kw)


def policy(**kw) -> Policy:
    return dataclasses.replace(Policy(), offhours=cfg(**kw))


@pytest.mark.parametrize(("when", "inside"), [
    (dt.datetime(2026, 11, 24, 23, 0), True),    # Tue 23:00: weekday night
    (dt.datetime(2026, 11, 25, 7, 59), True),    # Wed 07:59: tail of Tuesday's window
    (dt.datetime(2026, 11, 25, 8, 0), False),    # end is exclusive
    (dt.datetime(2026, 11, 25, 14, 0), False),   # working day
    (dt.datetime(2026, 11, 28, 14, 0), True),    # Saturday, all day
    (dt.datetime(2026, 11, 30, 7, 0), True),     # Monday 07:00: Sunday's window ends at 24:00, but Mon 07:00 is
                                                 # no weekday window's tail either (Sun is not in its days)
], ids=["night", "morning-tail", "end-exclusive", "day", "saturday", "monday-early"])
def test_windows_in_utc(when, inside) -> None:
    c = cfg(timezone="UTC")
    got = in_window(c, when.replace(tzinfo=dt.UTC).timestamp())
    if when.weekday() == 0 and when.hour == 7:
        assert got is False  # Sunday 00:00-24:00 does not spill into Monday; Mon-Fri windows start at 22:00
    else:
        assert got is inside


def test_dst_spring_forward_berlin_with_frozen_clock() -> None:
    # 2026-03-29: clocks jump 02:00 → 03:00 in Berlin. 08:30 local is outside a 22:00-08:00 weekday window
    # even though it is only 06:30 UTC; the day before (still winter time) 06:30 UTC was 07:30 local: inside.
    c = cfg(timezone="Europe/Berlin", windows=(Window(days=("fri", "sat", "sun", "mon"), start="22:00", end="08:00"),))
    with time_machine.travel(dt.datetime(2026, 3, 29, 6, 30, tzinfo=dt.UTC), tick=False):
        assert in_window(c, time.time()) is False
    with time_machine.travel(dt.datetime(2026, 3, 28, 6, 30, tzinfo=dt.UTC), tick=False):
        assert in_window(c, time.time()) is True
    with time_machine.travel(dt.datetime(2026, 3, 29, 5, 59, tzinfo=dt.UTC), tick=False):  # 07:59 CEST
        assert in_window(c, time.time()) is True


def test_dst_fall_back_berlin_with_frozen_clock() -> None:
    # 2026-10-25: 03:00 CEST → 02:00 CET. A window ending 08:00 local ends at 07:00 UTC, not 06:00 UTC.
    c = cfg(timezone="Europe/Berlin", windows=(Window(days=("sat",), start="22:00", end="08:00"),))
    with time_machine.travel(dt.datetime(2026, 10, 25, 6, 30, tzinfo=dt.UTC), tick=False):  # 07:30 CET
        assert in_window(c, time.time()) is True
    with time_machine.travel(dt.datetime(2026, 10, 25, 7, 0, tzinfo=dt.UTC), tick=False):  # 08:00 CET
        assert in_window(c, time.time()) is False
    # a window starting at 22:00 local begins at 21:00 UTC in winter, 20:00 UTC in summer
    assert in_window(c, at(2026, 10, 24, 22, 0)) is True
    assert in_window(c, dt.datetime(2026, 10, 24, 20, 30, tzinfo=dt.UTC).timestamp()) is True  # 22:30 CEST


def test_bad_window_and_zone_are_policy_errors() -> None:
    with pytest.raises(PolicyError, match=r"offhours\.timezone"):
        in_window(cfg(timezone="Mars/Olympus"), 0)
    with pytest.raises(PolicyError, match=r"offhours.windows\[0\].start"):
        in_window(cfg(windows=(Window(start="25:00", end="08:00"),)), 0)


# -- planning --------------------------------------------------------------------------------------
NIGHT = at(2026, 11, 24, 23, 0, tz=dt.UTC)  # Tuesday 23:00 UTC
DAY = at(2026, 11, 25, 14, 0, tz=dt.UTC)


def gpu_rows(host: str, n: int = 4, util: float = 0.5, power: float = 60.0, stale: bool = False) -> list[dict]:
    rows = []
    for i in range(n):
        r = {c: 0 for c in GPU_COLUMNS}
        r.update({"host": host, "gpu": i, "uuid": f"GPU-{host}-{i}", "model": "a100", "label_job_id": "",
                  "util_mean": util, "util_max": util, "mem_min_mib": 0.0, "mem_max_mib": 0.0, "mem_total_mib": 81920.0,
                  "power_w": power, "n_samples": 60, "expected_samples": 60, "last_ts": NIGHT, "stale": stale,
                  "util_mean_lb": util, "util_max_lb": util})
        rows.append(r)
    return rows


def snap(nodes: list[Node], gpus: list[dict], jobs=(), processes=()) -> Snapshot:
    return Snapshot(ts=NIGHT, window_s=3600, lookback_s=6 * 3600, source="test", gpus=pd.DataFrame(gpus),
                    jobs=tuple(jobs), processes=tuple(processes), nodes=tuple(nodes))


def cluster(n: int = 5, power: dict | None = None, states: dict | None = None):
    nodes, gpus = [], []
    for i in range(1, n + 1):
        name = f"gpu{i:02d}"
        st = (states or {}).get(name, "idle")
        alloc = 4 if st in ("allocated", "mixed") else 0
        nodes.append(Node(name=name, state=st, gpus_total=4, gpus_alloc=alloc, gpu_model="a100", partitions=("batch",)))
        gpus += gpu_rows(name, power=(power or {}).get(name, 60.0), util=90.0 if alloc else 0.5)
    return nodes, gpus


def test_idle_nodes_go_down_most_power_hungry_first_keeping_reserve() -> None:
    nodes, gpus = cluster(4, power={"gpu03": 120.0, "gpu04": 90.0})
    p = plan_power(snap(nodes, gpus), policy(warm_reserve_nodes=1, max_nodes_per_run=10), NIGHT)
    assert p.in_window and not p.held
    assert [c.node for c in p.down] == ["gpu03", "gpu04", "gpu01"]  # 480 W, 360 W, then by name
    assert p.reserve == ["gpu02"]
    assert p.down[0].power_w == pytest.approx(480.0) and "DCGM" in p.down[0].power_basis
    assert not p.needs_approval


def test_reserve_share_per_partition_and_exclusions() -> None:
    nodes, gpus = cluster(4)
    nodes[3] = dataclasses.replace(nodes[3], partitions=("debug",))
    p = plan_power(snap(nodes, gpus), policy(warm_reserve_nodes=0, warm_reserve_share=0.5, exclude_nodes=("gpu01",)),
                   NIGHT)
    # batch: 3 nodes, reserve ceil(1.5)=2, and gpu01 is excluded (stays up, counts toward it): one may go;
    # debug: 1 node, reserve ceil(0.5)=1: it stays
    assert [c.node for c in p.down] == ["gpu02"]
    assert set(p.reserve) == {"gpu03", "gpu04"}
    assert "gpu01" in p.skipped and "exclude_nodes" in p.skipped["gpu01"]
    p2 = plan_power(snap(nodes, gpus), policy(warm_reserve_nodes=0, exclude_partitions=("debug",)), NIGHT)
    assert "gpu04" not in {c.node for c in p2.down} and "debug" in p2.skipped["gpu04"]


def test_busy_nodes_jobs_processes_and_stale_metrics_are_never_candidates() -> None:
    nodes, gpus = cluster(5, states={"gpu01": "mixed"})
    gpus = [dict(r, util_mean=20.0) if r["host"] == "gpu01" else r for r in gpus if r["host"] != "gpu05"]
    gpus += gpu_rows("gpu05", stale=True)
    job = Job(job_id="7", user="u", state="RUNNING", nodes=("gpu02",), gpu_alloc=(("gpu02", (0,)),))
    proc = GpuProcess(host="gpu03", pid=42, used_mib=2048.0)
    p = plan_power(snap(nodes, gpus, jobs=[job], processes=[proc]), policy(warm_reserve_nodes=0), NIGHT)
    assert [c.node for c in p.down] == ["gpu04"]
    assert p.skipped["gpu01"] == "state mixed"
    assert p.skipped["gpu02"] == "a job runs there"
    assert p.skipped["gpu03"] == "a GPU process runs there"
    assert p.skipped["gpu05"] == "stale GPU metrics"


def test_cap_and_approval() -> None:
    nodes, gpus = cluster(6)
    p = plan_power(snap(nodes, gpus), policy(warm_reserve_nodes=0, max_nodes_per_run=3, approval_over_nodes=2), NIGHT)
    assert len(p.down) == 3 and p.capped == 3 and p.needs_approval
    p = plan_power(snap(nodes, gpus), policy(warm_reserve_nodes=0, max_nodes_per_run=3, approval_over_nodes=3), NIGHT)
    assert not p.needs_approval


def test_nothing_goes_down_outside_the_window_busy_cluster_or_high_priority_queue() -> None:
    nodes, gpus = cluster(3)
    assert plan_power(snap(nodes, gpus), policy(warm_reserve_nodes=0), DAY).down == []
    busy = [dict(r, util_mean=50.0) for r in gpus]
    p = plan_power(snap(nodes, busy), policy(warm_reserve_nodes=0), NIGHT)
    assert p.down == [] and "utilisation" in p.held[0]
    urgent = Job(job_id="9", user="u", state="PENDING", qos="urgent", gpus_requested=1)
    p = plan_power(snap(nodes, gpus, jobs=[urgent]), policy(warm_reserve_nodes=0), NIGHT)
    assert p.down == [] and "high-priority" in p.held[0]
    p = plan_power(snap(nodes, []), policy(warm_reserve_nodes=0), NIGHT)
    assert p.down == [] and "no fresh GPU metrics" in p.held[0]


def test_the_clusters_utilisation_is_its_own_gpus_not_those_outside_the_scheduler() -> None:
    """A busy cluster beside idle GPUs the same Prometheus scrapes on hosts outside the scheduler (an inference
    server, a workstation: attributed ``outside``, not counted among the cluster's GPUs): its utilisation is its own
    GPUs' mean, and nothing goes down. Averaged with the idle outsiders it read 12.5 %, under the 20 % gate."""
    nodes, gpus = cluster(3)
    busy = [dict(r, util_mean=50.0, attribution="slurm") for r in gpus]
    outside = [dict(r, util_mean=0.0, attribution="outside") for h in ("ws1", "ws2", "ws3") for r in gpu_rows(h, 12)]
    p = plan_power(snap(nodes, busy + outside), policy(warm_reserve_nodes=0, util_max=20.0), NIGHT)
    assert p.cluster_util == pytest.approx(50.0)
    assert p.down == [] and "utilisation" in p.held[0]
    # the outsiders alone are no fresh GPU metrics of the cluster
    p = plan_power(snap(nodes, outside), policy(warm_reserve_nodes=0, util_max=20.0), NIGHT)
    assert p.cluster_util is None and p.down == [] and "no fresh GPU metrics" in p.held[0]


def test_pending_and_forecast_demand_keep_or_wake_nodes() -> None:
    nodes, gpus = cluster(3)
    # 2 pending GPUs: one node's worth must stay up beyond the (zero) reserve
    pend = Job(job_id="5", user="u", state="PENDING", gpus_requested=6)
    p = plan_power(snap(nodes, gpus, jobs=[pend]), policy(warm_reserve_nodes=0), NIGHT)
    assert len(p.down) == 1
    # forecast: 10 GPUs expected within wake_lead, 12 up → at most 0 nodes can go (each has 4)
    p = plan_power(snap(nodes, gpus), policy(warm_reserve_nodes=0), NIGHT, forecast_gpus=10.0)
    assert p.down == []
    # wake: two nodes powered down by the agent, pending demand exceeds the free GPUs of the rest
    asleep = [dataclasses.replace(n, state="idle~", reason="gpu-cost: off-hours") for n in nodes[1:]]
    other = Node(name="gpu09", state="idle~", gpus_total=4, reason="maintenance")
    s = snap([nodes[0], *asleep, other], gpus[:4], jobs=[dataclasses.replace(pend, gpus_requested=8)])
    p = plan_power(s, policy(), NIGHT)
    assert [c.node for c in p.up] == ["gpu02"] and p.down == []
    assert "pending jobs need 8 GPUs" in p.up[0].reason
    p = plan_power(s, policy(), NIGHT, forecast_gpus=11.0)
    assert [c.node for c in p.up] == ["gpu02", "gpu03"]
    # outside the window every node the agent powered down comes back, never someone else's
    p = plan_power(snap([nodes[0], *asleep, other], gpus[:4]), policy(), DAY)
    assert [c.node for c in p.up] == ["gpu02", "gpu03"]


def test_savings_rows_per_node_hour() -> None:
    nodes = [Node(name="gpu02", state="idle~", reason="gpu-cost: off-hours"), Node(name="gpu03", state="idle~"),
             Node(name="gpu01", state="idle")]
    rows = savings_rows(nodes, {"gpu02": (480.0, "measured")}, OffhoursConfig(), 0.15, NIGHT)
    assert len(rows) == 1
    r = rows[0]
    assert r["kind"] == "power" and r["target"] == "node:gpu02" and r["kwh"] == pytest.approx(0.48)
    assert r["usd"] == pytest.approx(0.072) and r["saving_id"].endswith(str(int(NIGHT)))


# -- protections -----------------------------------------------------------------------------------
def protected(*prots: Protection, **kw) -> Policy:
    return dataclasses.replace(policy(**kw), protections=prots)


@pytest.mark.parametrize("level", ["never", "notify_only", "approval"])
def test_a_node_a_protection_names_is_never_powered_down_by_the_plan(level) -> None:
    nodes, gpus = cluster(4, power={"gpu03": 120.0})
    pol = protected(Protection(name="serving", level=level, match=Match(nodes=("gpu0[13]",))),
                    warm_reserve_nodes=0, max_nodes_per_run=10)
    p = plan_power(snap(nodes, gpus), pol, NIGHT)
    assert [c.node for c in p.down] == ["gpu02", "gpu04"]  # gpu03 is the hungriest, yet stays up
    for name in ("gpu01", "gpu03"):
        assert p.skipped[name].startswith(f"protected by 'serving' ({level})"), p.skipped[name]
    assert not p.needs_approval  # the hourly run asks no one about protected nodes: it leaves them up


def test_a_protection_naming_nodes_and_users_covers_jobs_there_not_the_idle_node() -> None:
    nodes, gpus = cluster(3)
    pol = protected(Protection(name="alice on a", level="never", match=Match(nodes=("gpu*",), users=("alice",))),
                    warm_reserve_nodes=0, min_up=0)
    assert {c.node for c in plan_power(snap(nodes, gpus), pol, NIGHT).down} == {"gpu01", "gpu02", "gpu03"}


def test_a_node_running_or_holding_a_protected_job_is_skipped_with_the_protections_name() -> None:
    nodes, gpus = cluster(4)
    label = Protection(name="no-interrupt label", level="never", match=Match(labels=("no-interrupt",)))
    acct = Protection(name="vip account", level="approval", match=Match(accounts=("vip",)))
    running = Job(job_id="11", user="u", labels=("no-interrupt",), nodes=("gpu01",), gpu_alloc=(("gpu01", (0,)),))
    # a pending job Slurm already placed on gpu02 (its node is listed): it holds the node
    held = Job(job_id="12", user="v", state="PENDING", account="vip", nodes=("gpu02",), gpus_requested=1)
    plain = Job(job_id="13", user="w", state="PENDING", account="other", nodes=("gpu03",), gpus_requested=1)
    p = plan_power(snap(nodes, gpus, jobs=[running, held, plain]), protected(label, acct, warm_reserve_nodes=0), NIGHT)
    assert p.skipped["gpu01"] == "protected by 'no-interrupt label' (never): job 11 runs there or holds it"
    assert p.skipped["gpu02"] == "protected by 'vip account' (approval): job 12 runs there or holds it"
    assert {c.node for c in p.down} == {"gpu03", "gpu04"}  # an unprotected pending job does not hold its node


# -- the manual power-down -------------------------------------------------------------------------
def test_vet_refuses_busy_excluded_protected_and_unknown_nodes() -> None:
    nodes, gpus = cluster(6)
    job = Job(job_id="7", user="u", nodes=("gpu02",), gpu_alloc=(("gpu02", (0,)),))
    pol = protected(Protection(name="debug boxes", level="never", match=Match(nodes=("gpu04",))),
                    warm_reserve_nodes=0, exclude_nodes=("gpu03",), max_nodes_per_run=10)
    chosen, refused = vet_power_down(snap(nodes, gpus, jobs=[job]), pol, NIGHT,
                                     ["gpu01", "gpu02", "gpu03", "gpu04", "gpu99", "gpu01"])
    assert [c.node for c in chosen] == ["gpu01"]
    assert "manual power-down" in chosen[0].reason and chosen[0].protection is None
    assert refused == {
        "gpu02": "a job runs there",
        "gpu03": "excluded by offhours.exclude_nodes (gpu03)",
        "gpu04": "protected by 'debug boxes' (never): the policy names this node",
        "gpu99": "not in the current snapshot",
    }


def test_vet_ignores_the_window_and_utilisation_but_not_stale_metrics_or_degraded_data() -> None:
    nodes, gpus = cluster(3)
    gpus = [dict(r, util_mean=60.0) if r["host"] == "gpu01" else r for r in gpus]  # a busy cluster mean...
    gpus = [dict(r, util_max=60.0) if r["host"] == "gpu01" else r for r in gpus]  # ...from gpu01's GPUs
    gpus = [dict(r, stale=True) if r["host"] == "gpu03" else r for r in gpus]
    s = dataclasses.replace(snap(nodes, gpus), ts=DAY)
    chosen, refused = vet_power_down(s, policy(warm_reserve_nodes=0), DAY, ["gpu01", "gpu02", "gpu03"])
    assert [c.node for c in chosen] == ["gpu02"]  # daytime and a busy cluster do not matter by hand
    assert refused == {"gpu01": "a GPU was busy in the window", "gpu03": "stale GPU metrics"}
    bad = dataclasses.replace(s, problems=("prometheus: timeout",))
    chosen, refused = vet_power_down(bad, policy(warm_reserve_nodes=0), DAY, ["gpu02"])
    assert chosen == [] and "degraded data" in refused["gpu02"]


def test_vet_keeps_the_warm_reserve_and_the_cap() -> None:
    nodes, gpus = cluster(6, power={"gpu05": 200.0, "gpu06": 150.0})
    s = snap(nodes, gpus)
    every = [n.name for n in nodes]
    # reserve of 2 idle nodes in 'batch': 4 of 6 may go, but the cap allows 3, the hungriest first
    chosen, refused = vet_power_down(s, policy(warm_reserve_nodes=2, max_nodes_per_run=3), NIGHT, every)
    assert [c.node for c in chosen] == ["gpu05", "gpu06", "gpu01"]
    assert refused == dict.fromkeys(["gpu02", "gpu03", "gpu04"], "cap offhours.max_nodes_per_run=3 reached")
    # a reserve of 4: two may go, the four frugal ones stay up
    chosen, refused = vet_power_down(s, policy(warm_reserve_nodes=4, max_nodes_per_run=10), NIGHT, every)
    assert [c.node for c in chosen] == ["gpu05", "gpu06"]
    assert set(refused) == {"gpu01", "gpu02", "gpu03", "gpu04"}
    assert all(v == "kept up as the warm reserve of partition batch (4 idle node(s))" for v in refused.values())
    # asking for only two nodes still keeps the reserve counted over the whole partition
    chosen, refused = vet_power_down(s, policy(warm_reserve_nodes=5, max_nodes_per_run=10), NIGHT, ["gpu01", "gpu02"])
    assert [c.node for c in chosen] == ["gpu01"] and "warm reserve of partition batch" in refused["gpu02"]
    # the nodes other requests or the plan left idle count: with a reserve of 6 nothing may go
    chosen, refused = vet_power_down(s, policy(warm_reserve_nodes=6), NIGHT, ["gpu01"])
    assert chosen == [] and "warm reserve" in refused["gpu01"]


def test_vet_passes_approval_and_overridden_protections_marked_for_a_human() -> None:
    nodes, gpus = cluster(3)
    ask = Protection(name="ask first", level="approval", match=Match(nodes=("gpu01",)))
    never = Protection(name="hands off", level="never", match=Match(nodes=("gpu02",)))
    pol = protected(ask, never, warm_reserve_nodes=0)
    chosen, refused = vet_power_down(snap(nodes, gpus), pol, NIGHT, ["gpu01", "gpu02"])
    assert [(c.node, c.protection) for c in chosen] == [("gpu01", "ask first")]
    assert "a human must approve" in chosen[0].reason and "hands off" in refused["gpu02"]
    chosen, refused = vet_power_down(snap(nodes, gpus), pol, NIGHT, ["gpu01", "gpu02"], override_protections=True)
    assert [(c.node, c.protection) for c in chosen] == [("gpu01", "ask first"), ("gpu02", "hands off")]
    assert refused == {} and "overridden" in chosen[1].reason
    # a protected job on the node refuses it even with the override
    job = Job(job_id="8", user="u", state="PENDING", labels=("no-interrupt",), nodes=("gpu03",), gpus_requested=1)
    label = Protection(name="no-interrupt label", level="never", match=Match(labels=("no-interrupt",)))
    chosen, refused = vet_power_down(snap(nodes, gpus, jobs=[job]), protected(label, warm_reserve_nodes=0), NIGHT,
                                     ["gpu03"], override_protections=True)
    assert chosen == [] and refused["gpu03"].startswith("protected by 'no-interrupt label'")


def test_a_predicted_lull_powers_down_by_day_only_with_forecast_lulls() -> None:
    nodes, gpus = cluster(5, states={"gpu01": "allocated"})
    # 14:00 on a weekday: outside every window; the forecast's upper bound over the lull is 6 GPUs
    plain = plan_power(snap(nodes, gpus), policy(warm_reserve_nodes=0, max_nodes_per_run=10), DAY,
                       forecast_gpus=4.0, lull_gpus=6.0)
    assert not plain.down and plain.held == ["outside the off-hours window"] and plain.lull_gpus is None
    sized = plan_power(snap(nodes, gpus), policy(warm_reserve_nodes=0, max_nodes_per_run=10, forecast_lulls=True),
                       DAY, forecast_gpus=4.0, lull_gpus=6.0)
    # 20 GPUs up; 6 must stay up for the lull's upper bound: 3 idle nodes of 4 GPUs go, 2 nodes (8 GPUs) stay
    assert len(sized.down) == 3 and not sized.in_window and sized.lull_gpus == 6.0
    assert all("predicted lull" in c.reason for c in sized.down)
    assert sized.to_dict()["lull_gpus"] == 6.0
    # the forecast takes the place of util_max: a busy cluster still sheds what the forecast does not need
    busy = [dict(r, util_mean=95.0) for r in gpus if r["host"] == "gpu01"] + [r for r in gpus if r["host"] != "gpu01"]
    assert len(plan_power(snap(nodes, busy), policy(warm_reserve_nodes=0, max_nodes_per_run=10, forecast_lulls=True,
                                                    util_max=1.0), DAY, lull_gpus=6.0).down) == 3
    # no forecast: the windows alone decide, as without the knob
    assert not plan_power(snap(nodes, gpus), policy(forecast_lulls=True), DAY).down


def test_outside_the_windows_a_forecast_wakes_only_what_it_needs() -> None:
    nodes, gpus = cluster(4, states={"gpu01": "allocated"})
    asleep = [dataclasses.replace(n, state="idle~", reason="gpu-cost: off-hours") if n.name in ("gpu03", "gpu04")
              else n for n in nodes]
    gpus = [r for r in gpus if r["host"] not in ("gpu03", "gpu04")]
    both = plan_power(snap(asleep, gpus), policy(), DAY, forecast_gpus=10.0, lull_gpus=10.0)
    assert [c.node for c in both.up] == ["gpu03", "gpu04"]  # the windows alone: every node comes back by day
    sized = plan_power(snap(asleep, gpus), policy(forecast_lulls=True), DAY, forecast_gpus=10.0, lull_gpus=10.0)
    assert [c.node for c in sized.up] == ["gpu03"] and "forecast demand 10 GPUs within 90 min" in sized.up[0].reason


# -- nodes that do not come back, and the last healthy nodes of a partition ------------------------
def test_the_last_healthy_nodes_of_a_partition_stay_up_busy_ones_count_failed_ones_do_not() -> None:
    nodes, gpus = cluster(4, states={"gpu01": "allocated"})
    # gpu01 busy, gpu02-04 idle; no warm reserve: min_up 2 lets two of the idle ones go
    pol = policy(warm_reserve_nodes=0, min_up=2, max_nodes_per_run=10, util_max=50.0)
    p = plan_power(snap(nodes, gpus), pol, NIGHT)
    assert len(p.down) == 2 and len(p.reserve) == 1
    kept = p.reserve[0]
    assert p.skipped[kept] == "kept up: one of the last 2 healthy node(s) of partition batch (offhours.min_up)"
    # a node that did not come back is not healthy: it holds no place among the last ones
    nodes[0] = dataclasses.replace(nodes[0], state="down*", reason="ResumeTimeout reached", gpus_alloc=0)
    p = plan_power(snap(nodes, gpus), pol, NIGHT)
    assert len(p.down) == 1 and set(p.failed) == {"gpu01"}
    # a manual power-down passes the same floor
    chosen, refused = vet_power_down(snap(nodes, gpus), policy(warm_reserve_nodes=0, min_up=3), NIGHT,
                                     ["gpu02", "gpu03", "gpu04"])
    assert chosen == [] and all("offhours.min_up" in why for why in refused.values())


@pytest.mark.parametrize(("state", "reason", "why"), [
    ("down*", "ResumeTimeout reached", "failed to resume: down* (ResumeTimeout reached)"),
    ("down~", "", "failed to resume: down~ (no reason given)"),
    ("drained", "gres/gpu count reported lower than configured (2 < 4)",
     "GPUs missing after boot: drained (gres/gpu count reported lower than configured (2 < 4))"),
    ("idle", "ResumeTimeout reached", None),      # back and serving: Slurm keeps the old reason text
    ("down*", "Not responding", None),            # down for a reason of its own, not power saving
    ("idle~", "gpu-cost: off-hours", None),       # powered down as planned
], ids=["resume-timeout", "down-powered-off", "gpus-missing", "recovered", "down-other", "asleep"])
def test_a_node_that_did_not_come_back_is_found_by_slurms_own_verdict(state, reason, why) -> None:
    from gpu_cost.capacity.offhours import resume_failures

    node = Node(name="gpu07", state=state, gpus_total=4, partitions=("batch",), reason=reason)
    assert resume_failures([node]) == ({} if why is None else {"gpu07": why})


def test_failed_nodes_are_reported_never_woken_or_powered_down_and_earlier_failures_count() -> None:
    nodes, gpus = cluster(3)
    nodes[2] = dataclasses.replace(nodes[2], state="down*", reason="ResumeTimeout reached")
    # gpu01 came back by the operator's hand, but an earlier run saw it fail: it stays up
    p = plan_power(snap(nodes, gpus), policy(warm_reserve_nodes=0, min_up=0), NIGHT,
                   failed={"gpu01": "failed to resume: down* (ResumeTimeout reached), seen 2026-11-24T21:00Z"})
    assert [c.node for c in p.down] == ["gpu02"]
    assert p.skipped["gpu01"].startswith("did not come back from power saving (failed to resume")
    assert p.problems == [
        "node gpu01 did not come back from power saving: failed to resume: down* (ResumeTimeout reached), "
        "seen 2026-11-24T21:00Z",
        "node gpu03 did not come back from power saving: failed to resume: down* (ResumeTimeout reached)"]
    assert p.to_dict()["failed"] == p.failed
    # outside the window the agent wakes what it powered down, never a node that failed to come back
    asleep = dataclasses.replace(nodes[1], state="idle~", reason="gpu-cost: off-hours")
    failed = dataclasses.replace(nodes[2], state="down~", reason="gpu-cost: off-hours")
    p = plan_power(snap([nodes[0], asleep, failed], gpus), policy(), at(2026, 11, 25, 14, tz=dt.UTC))
    assert [c.node for c in p.up] == ["gpu02"] and "gpu03" in p.failed


def test_node_types_give_idle_draw_and_boot_energy_where_dcgm_is_silent() -> None:
    from gpu_cost.capacity.offhours import node_power
    from gpu_cost.config.schema import NodePower

    c = cfg(node_types={"h100": NodePower(idle_power_w=900.0, boot_kwh=0.4), "a100": NodePower(boot_kwh=0.2)})
    h100 = Node(name="h1", gpu_model="H100", gpus_total=8)
    a100 = Node(name="a1", gpu_model="a100", gpus_total=8)
    empty = Snapshot(ts=NIGHT, window_s=3600, lookback_s=3600, source="test", gpus=pd.DataFrame(columns=GPU_COLUMNS))
    assert node_power(empty, h100, c) == (900.0, "policy offhours.node_types.h100")
    assert node_power(empty, a100, c) == (400.0, "policy offhours.idle_power_w")
    assert c.node_power("h100") == (900.0, 0.4) and c.node_power("a100") == (400.0, 0.2)
    assert c.node_power("") == (400.0, 0.15)
    # measured GPU power wins
    assert node_power(snap([h100], gpu_rows("h1", power=100.0)), h100, c) == (400.0, "measured (DCGM GPU power)")


def test_bad_offhours_keys_name_the_file_and_path(tmp_path) -> None:
    from gpu_cost.config.loader import load_policy

    for text, where in (("offhours:\n  min_up: -1\n", "offhours.min_up"),
                        ("offhours:\n  forecast_quantile: 0.2\n", "offhours.forecast_quantile"),
                        ("offhours:\n  node_types: {h100: {idle_watts: 900}}\n", "offhours.node_types.h100"),
                        ("offhours:\n  failed_hold: 400d\n", "offhours.failed_hold")):
        path = tmp_path / "p.yaml"
        path.write_text(text)
        with pytest.raises(PolicyError, match=where.replace(".", r"\.")) as exc:
            load_policy(str(path))
        assert "p.yaml" in str(exc.value)


def test_a_node_is_idle_over_the_off_hours_window_not_over_the_sweeps_shorter_one() -> None:
    """``offhours.window`` is what idle means to the plan: the cluster's utilisation gate and each node's GPUs are
    read over it, whatever windows the rules judge by. With a 90-minute window (no rule's), a node whose GPU ran
    40 minutes ago outside any job is not idle. The snapshot held no 90-minute aggregates: the gate fell back to
    the sweep's primary 15 minutes, each node was read over them, and the node went down."""
    import numpy as np

    from gpu_cost.perceive.snapshot import from_matrix, rule_windows

    p = policy(warm_reserve_nodes=0, min_up=0, window=5400.0)
    assert 5400.0 in rule_windows(p)[1]
    times = NIGHT - 60.0 * np.arange(180)[::-1]  # three hours of samples, one a minute
    util = np.zeros((8, len(times)))
    util[4, (times > NIGHT - 2400) & (times <= NIGHT - 1800)] = 80.0  # gpu02's first GPU, 40 to 30 minutes ago
    nodes = [Node(name=h, state="idle", gpus_total=4, gpus_alloc=0, gpu_model="a100", partitions=("batch",))
             for h in ("gpu01", "gpu02")]
    hosts = np.array(["gpu01"] * 4 + ["gpu02"] * 4, dtype=object)
    s = from_matrix(policy=p, now=NIGHT, source="test", hosts=hosts, gpus=np.tile(np.arange(4), 2),
                    uuids=np.array([f"GPU-{i}" for i in range(8)], dtype=object), models=np.full(8, "a100", dtype=object),
                    mem_total=np.full(8, 81920.0), times=times, util=util, mem=np.zeros_like(util),
                    power=np.full_like(util, 60.0), job=np.full((8, 1), "", dtype=object), jobs=(), processes=(),
                    nodes=nodes)
    plan = plan_power(s, p, NIGHT)
    assert [c.node for c in plan.down] == ["gpu01"]
    assert plan.skipped["gpu02"] == "a GPU was busy in the window"
    assert plan.cluster_util == pytest.approx(80.0 * 10 / 90 / 8, abs=0.01)  # ten busy minutes of one GPU in eight


@pytest.mark.parametrize("seed", range(20))
def test_over_random_windows_a_node_goes_down_only_when_idle_over_all_of_it(seed: int) -> None:
    """Random off-hours windows (10 minutes to 3 hours, a rule's or not) over random nodes, each with one GPU busy for a
    random spell in the last four hours, or never: a node goes down exactly when its spell ended before the window
    began, and the plan's utilisation is the mean over that window of every GPU's samples."""
    import numpy as np

    from gpu_cost.perceive.snapshot import from_matrix

    rng = np.random.default_rng(seed)
    window = float(rng.choice([600.0, 900.0, 1800.0, 3600.0, 5400.0, 7200.0, 10800.0]))
    p = policy(warm_reserve_nodes=0, min_up=0, window=window, util_max=100.0, max_nodes_per_run=100)
    n_nodes = int(rng.integers(2, 7))
    times = NIGHT - 60.0 * np.arange(300)[::-1]  # five hours, one sample a minute
    util = np.zeros((4 * n_nodes, len(times)))
    busy_until = {}
    for k in range(n_nodes):
        if rng.random() < 0.25:
            continue  # idle all along
        end = NIGHT - float(rng.integers(0, 240)) * 60.0
        start = end - float(rng.integers(1, 30)) * 60.0
        util[4 * k + int(rng.integers(0, 4)), (times > start) & (times <= end)] = 80.0
        busy_until[f"gpu{k:02d}"] = end
    names = [f"gpu{k:02d}" for k in range(n_nodes)]
    nodes = [Node(name=h, state="idle", gpus_total=4, gpus_alloc=0, gpu_model="a100", partitions=("batch",))
             for h in names]
    n = 4 * n_nodes
    s = from_matrix(policy=p, now=NIGHT, source="test", hosts=np.repeat(np.array(names, dtype=object), 4),
                    gpus=np.tile(np.arange(4), n_nodes), uuids=np.array([f"GPU-{i}" for i in range(n)], dtype=object),
                    models=np.full(n, "a100", dtype=object), mem_total=np.full(n, 81920.0), times=times, util=util,
                    mem=np.zeros_like(util), power=np.full_like(util, 60.0), job=np.full((n, 1), "", dtype=object),
                    jobs=(), processes=(), nodes=nodes)
    plan = plan_power(s, p, NIGHT)
    want = sorted(h for h in names if busy_until.get(h, -np.inf) <= NIGHT - window)
    assert sorted(c.node for c in plan.down) == want
    assert all(plan.skipped[h] == "a GPU was busy in the window" for h in names if h not in want)
    in_window = times > NIGHT - window
    assert plan.cluster_util == pytest.approx(float(util[:, in_window].mean()), abs=1e-9)
