"""A bad policy file fails the sweep DAG in ``check_policy``, before anything is collected.

Each file below is wrong in a way a person editing YAML gets wrong: a typo'd key, a wrong type,
contradictory rules, an absurd threshold. The whole DAG runs with ``dag.test()``; the run fails,
``check_policy`` is the failed task and its error names the file, the path and the reason, and
``collect`` never ran (no snapshot, no audit run row with data).
"""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

BAD = {
    "typo": ("version: 1\nmode: enforce\nrules:\n  idle_allocation: {windw: 15m}\n", "rules.idle_allocation"),
    "wrong-type": ("version: 1\nmode: enforce\ncaps: {max_actions_per_run: lots}\n", "caps.max_actions_per_run"),
    "contradiction": ("version: 1\nmode: enforce\nrules:\n  idle_allocation:\n    ladder:\n"
                      "      - {action: kill}\n      - {action: terminate, after: 1h}\n", "rules.idle_allocation"),
    "absurd": ("version: 1\nmode: enforce\nrules:\n  zombie: {util_max: 250}\n", "rules.zombie.util_max"),
}


@pytest.mark.parametrize("case", sorted(BAD), ids=sorted(BAD))
def test_bad_policy_fails_in_check_policy_before_collect(case, airflow_db, dagbag, tmp_path,  # type: ignore[no-untyped-def]
                                                        monkeypatch) -> None:
    from gpu_cost.audit.store import AuditStore

    text, path = BAD[case]
    policy = tmp_path / f"{case}.yaml"
    policy.write_text(text)
    monkeypatch.setenv("GPU_COST_POLICY_DIR", str(tmp_path))
    dag = dagbag.dags["gpu_zombie_sweep"]
    store = AuditStore().ensure_schema()
    snapshots_before = store.table_counts()["gpu_cost_snapshots"]
    dr = dag.test(run_conf={"policy": case, "source": "sim"})
    tis = {ti.task_id: ti for ti in dr.get_task_instances()}
    assert dr.state == "failed"
    assert tis["check_policy"].state == "failed"
    assert tis["collect"].state in ("upstream_failed", None, "skipped"), tis["collect"].state
    assert tis["metrics_fresh"].state in ("upstream_failed", None, "skipped")
    assert store.table_counts()["gpu_cost_snapshots"] == snapshots_before
    run_id = f"gpu_zombie_sweep:{dr.run_id}"
    row = store.get_run(run_id)
    assert row is None or (row["status"] == "failed" and row["data_ts"] is None)
    # the error names the file, the path and the reason (the loader's message, checked directly)
    from gpu_cost.config.loader import load_policy
    from gpu_cost.core.errors import PolicyError

    with pytest.raises(PolicyError) as err:
        load_policy(policy)
    assert str(policy) in str(err.value) and path in str(err.value)
