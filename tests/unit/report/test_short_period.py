"""A report over less than a week of data says what it measured.

A live deployment's first weekly report held 10 hours of usage for a 24-GPU cluster: it said "1
GPUs on average" (the GPU-hours divided by the week's 168 hours, not by the 10 measured) and
headed its columns "this week / vs last week". The average is over the time the sweeps cover, and
the columns are named after what was measured and what it is compared with.
"""

from __future__ import annotations

import re

import pytest

from gpu_cost.audit.store import AuditStore
from gpu_cost.report import kpis
from gpu_cost.report.render import render_markdown
from tests.unit.report.test_kpis import HOUR, SINCE, UNTIL, usage

WEEK = 7 * 86400.0
#: ten hourly sweeps of a 24-GPU cluster (three hosts of 8), ending Wednesday 08:00 UTC of the week
END = SINCE + 2 * 86400 + 8 * HOUR
SWEEPS = [END - k * HOUR for k in range(10)]


def _ten_hours(store: AuditStore) -> AuditStore:
    rows = []
    for t in SWEEPS:
        rows += [usage(t, "n1", "alice", "nlp", 8, 8, 8, 0, 0, 7.2),
                 usage(t, "n2", "bob", "vision", 8, 8, 0, 8, 0, 0.0),
                 usage(t, "n3", "", "", 8, 0, 0, 0, 0, 0.0)]
    store.execute("upsert_usage", rows)
    return store


def _columns(md: str) -> list[str]:
    header = next(line for line in md.splitlines() if line.startswith("| |"))
    return [c.strip() for c in header.strip("|").split("|")][1:]


@pytest.mark.parametrize(("since", "until", "versus"), [
    (SINCE, UNTIL, "vs last week"),                                   # the week the DAG reports on
    (END - WEEK, END, "vs last week"),                                # gpu-cost report --since 7d
    (END - 10 * HOUR, END, "vs the same 10 h a week before"),         # a period of 10 h
], ids=["iso-week", "last-7-days", "ten-hours"])
def test_ten_hours_of_a_24_gpu_cluster(store: AuditStore, policy, since: float, until: float,  # type: ignore[no-untyped-def]
                                       versus: str) -> None:
    k = kpis.compute(_ten_hours(store), policy, since, until)
    c = k["cluster"]
    assert c["sweeps"] == 10 and c["gpu_hours"] == 240.0
    assert c["gpus_avg"] == 24.0 and c["measured_hours"] == 10.0
    assert (k["period"]["this"], k["period"]["versus"]) == ("these 10 h", versus)
    assert _columns(render_markdown(k)) == ["these 10 h", versus]


def test_a_measured_week_is_this_week_against_last_week(store: AuditStore, policy) -> None:  # type: ignore[no-untyped-def]
    store.execute("upsert_usage", [usage(SINCE + (i + 1) * HOUR, "n1", "alice", "nlp", 24, 24, 24, 0, 0, 20.0)
                                   for i in range(7 * 24)])
    k = kpis.compute(store, policy, SINCE, UNTIL)
    assert k["cluster"]["gpus_avg"] == 24.0 and k["cluster"]["measured_hours"] == 168.0
    assert (k["period"]["this"], k["period"]["versus"]) == ("this week", "vs last week")
    md = render_markdown(k)
    assert _columns(md) == ["this week", "vs last week"]


def test_the_html_report_says_what_it_measured(store: AuditStore, policy) -> None:  # type: ignore[no-untyped-def]
    from gpu_cost.report.charts import render_all
    from gpu_cost.report.render import render_html

    k = kpis.compute(_ten_hours(store), policy, SINCE, UNTIL)
    html = render_html(k, render_all(k))
    meta = re.sub(r"\s+", " ", html.split('<div class="meta">')[1].split("</div>")[0])
    assert "24 GPUs on average" in meta and "10 h measured" in meta
    cards = html.split('<div class="cards">')[1].split("<h2>")[0]
    assert "no previous data" in cards and "week" not in cards
    assert "this week" not in html
