"""The report's SQL on the real PostgreSQL: the same replayed days give the same KPIs as on SQLite."""

from __future__ import annotations

import pytest

from gpu_cost.report import kpis
from gpu_cost.sim.week import seed_week
from tests.fixtures.core import NOW

pytestmark = pytest.mark.integration


def test_kpis_are_the_same_on_postgres_and_sqlite(pg_store, store, policy) -> None:  # type: ignore[no-untyped-def]
    since, until = NOW - 2 * 86400, NOW
    for s in (pg_store, store):
        seed_week(s, policy, until, nodes=2, step_s=3600)
    on_pg = kpis.compute(pg_store, policy, since, until)
    on_lite = kpis.compute(store, policy, since, until)
    assert on_pg["cluster"]["sweeps"] == 48
    for key in ("cluster", "by_team", "by_user", "events", "savings", "right_sizing", "heatmap", "daily", "change"):
        assert on_pg[key] == on_lite[key], key
    assert on_pg["events"]["live_total"] > 0
