"""Right-sizing's SQL on the real PostgreSQL: the same job rows give the same advice, file and report figures
as on SQLite (per-job quantiles come from GROUP BY histograms, times from TIMESTAMPTZ)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpu_cost.audit.store import AuditStore
from gpu_cost.capacity import rightsize
from tests.fixtures.core import NOW
from tests.unit.test_rightsize import H, history, job_rows, policy, still_running

pytestmark = pytest.mark.integration


def fill(store: AuditStore) -> None:
    history(store, 6)
    history(store, 6, first=6, name="eval-{i}", gpus=4, needs=[1] * 6 + [3] * 6, limit=2 * H)
    history(store, 7, user="bob", needs=[8] * 12)
    still_running(store)


def test_postgres_and_sqlite_agree(pg_store: Any, tmp_path: Path) -> None:
    lite = AuditStore(f"sqlite:///{tmp_path / 'audit.db'}").ensure_schema()
    out: dict[str, Any] = {}
    for name, s in (("pg", pg_store), ("lite", lite)):
        fill(s)
        summary = rightsize.publish(s, policy(block=True), NOW, run_id="r", out=tmp_path / f"{name}.tsv")
        s.execute("upsert_job_usage", job_rows("later-1", gpus=1, needs=[1], start=NOW + H, limit=5400.0)
                  + job_rows("later-2", gpus=8, needs=[1], start=NOW + 2 * H))
        out[name] = (summary, (tmp_path / f"{name}.tsv").read_text(), rightsize.followed(s, NOW, NOW + 86400.0),
                     [{**r, "advice_file": Path(r["advice_file"]).suffix}
                      for r in s.query("SELECT * FROM gpu_cost_rightsize ORDER BY scope, user_name, stem")])
    assert out["pg"][0] == {**out["lite"][0], "file": str(tmp_path / "pg.tsv")}
    assert out["pg"][1:] == out["lite"][1:]
    assert out["pg"][0]["advice"] >= 3 and out["pg"][2]["advised_jobs"] == 2
