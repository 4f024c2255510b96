"""Outcomes as labels, the verifier trained on them, and its gate on destructive rungs.

Decisions come from real sweeps of the simulated cluster on a real SQLite audit store; what the
later sweeps saw is written as the usage rows a sweep writes (``upsert_job_usage``).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import numpy as np
import pytest

from gpu_cost.audit.store import AuditStore
from gpu_cost.config.loader import parse_policy
from gpu_cost.config.schema import Policy
from gpu_cost.core.model import Decision
from gpu_cost.decide.engine import guard
from gpu_cost.learn import outcomes, verifier
from gpu_cost.loop import sweep

NOW = 1_800_000_000.0
POLICY = """
mode: enforce
verifier: {min_labels: 20, horizon: 2h}
"""


@pytest.fixture
def policy() -> Policy:
    return parse_policy(POLICY)


@pytest.fixture
def store() -> AuditStore:
    return AuditStore("sqlite:///:memory:").ensure_schema()


def usage(job_id: str, ts: float, active: int, gpus: int = 2, data_ts: float | None = None) -> dict[str, Any]:
    """One ``gpu_cost_jobs_usage`` row as a sweep at ``ts`` writes it."""
    return {"ts": ts, "job_id": job_id, "interval_s": 300.0, "user_name": "carol", "account": "nlp",
            "partition_name": "gpu", "gpu_model": "a100", "job_name": "train", "gpus": gpus, "gpus_requested": gpus,
            "gpus_busy": active, "gpus_active": active, "gpus_stale": 0, "work_gpus": 0.5 * active,
            "time_limit_s": 86400.0, "start_ts": ts - 36000, "run_id": f"r{int(ts)}", "data_ts": data_ts or ts}


def notice_on_1003(policy: Policy, store: AuditStore) -> Decision:
    """One sweep at NOW: its notice to carol about job 1003 (idle, 2 GPUs)."""
    run = sweep.run_once(policy, NOW, store, source="sim", run_id="s0")
    d = next(x for x in run["decisions"] if x["target"] == "job:1003")
    assert d["action"] == "notify"
    return Decision.from_row(store.get_decision(d["decision_id"]) or {})


def copies(d: Decision, n: int, *, start: float, every: float, **evidence: Any) -> list[Decision]:
    """Return ``n`` copies of a real decision on other jobs (job 5000+i), ``every`` seconds apart."""
    out = []
    for i in range(n):
        jid = f"{5000 + i}{evidence.get('mem_min_mib', 0):.0f}"
        out.append(dataclasses.replace(d, decision_id=f"{d.decision_id[:8]}-{jid}", job_id=jid, target=f"job:{jid}",
                                       ts=start + i * every, evidence={**d.evidence, **evidence}))
    return out


# -- outcomes -----------------------------------------------------------------------------------------
def test_labels_follow_the_later_usage_rows(policy: Policy, store: AuditStore) -> None:
    d = notice_on_1003(policy, store)
    # a copy of it on jobs that went on differently afterwards
    busy, gone, idle, late = (dataclasses.replace(d, decision_id=f"d-{k}", job_id=k, target=f"job:{k}")
                              for k in ("21", "22", "23", "24"))
    late = dataclasses.replace(late, ts=NOW + 6000)
    store.record_decisions([busy, gone, idle, late], "s0")
    rows = [usage("1003", NOW + k * 300, 0) for k in range(1, 30)]
    rows += [usage("21", NOW + k * 300, 2 if k == 4 else 0) for k in range(1, 30)]  # busy again after 20 min
    rows += [usage("22", NOW + k * 300, 0) for k in range(1, 3)]  # gone after 10 min
    rows += [usage("23", NOW + k * 300, 0) for k in range(1, 30)]
    rows += [usage("24", NOW + 6000 + k * 300, 0) for k in range(1, 3)]
    store.execute("upsert_job_usage", rows)
    until = NOW + 29 * 300
    got = {r["target"]: r for r in outcomes.compute(store, until, policy.verifier.horizon, NOW - 1)}
    assert got["job:21"]["outcome"] == "active_again" and got["job:21"]["after_s"] == 1200
    assert got["job:22"]["outcome"] == "ended" and got["job:22"]["after_s"] == 600
    assert got["job:23"]["outcome"] == "still_idle" and got["job:1003"]["outcome"] == "still_idle"
    assert got["job:24"]["outcome"] == "ended"  # its last row is well before the newest sweep
    # one sweep later job 23 wakes up: outside the 2 h horizon, so still waste confirmed
    store.execute("upsert_job_usage", [usage("23", NOW + 30 * 300, 2)])
    assert {r["target"]: r["outcome"] for r in outcomes.compute(
        store, NOW + 30 * 300, policy.verifier.horizon, NOW - 1)}["job:23"] == "still_idle"
    # too recent to say: a decision whose horizon has not passed
    early = {r["target"]: r["outcome"] for r in outcomes.compute(store, NOW + 900, policy.verifier.horizon, NOW - 1)}
    assert early["job:23"] == "pending" and early["job:21"] == "pending"
    assert outcomes.label_of("active_again") == 0 and outcomes.label_of("still_idle") == 1
    assert outcomes.label_of("pending") is None and outcomes.label_of("acted") is None


def test_a_wrong_answer_and_a_kill_are_outcomes_and_an_older_instant_never_replaces_a_newer_one(
        policy: Policy, store: AuditStore) -> None:
    d = notice_on_1003(policy, store)
    store.execute("upsert_job_usage", [usage("1003", NOW + k * 300, 0) for k in range(1, 30)])
    # the sweep's process notice: killed one minute after it
    proc = next(r for r in store.decisions_of_run("s0") if r["target"].startswith("proc:"))
    store.action_started(action_id="k1", decision_id=proc["decision_id"], run_id="s1", action="kill_process",
                         target=proc["target"], executor="x", dry_run=False, started_at=NOW + 50)
    store.action_finished("k1", "succeeded", NOW + 60)
    outcomes.refresh(store, policy, NOW + 29 * 300, run_id="n1")
    store.execute("insert_answer", {
        "answer_id": "a1", "ts": NOW + 29 * 300 + 5, "channel": "link", "choice": "wrong", "status": "accepted",
        "refusal": None, "decision_id": d.decision_id, "rule": d.rule, "target": d.target, "episode": d.episode,
        "job_id": "1003", "answered_by": "carol", "owner": "carol", "role": "owner", "duration_s": None,
        "reason": "it is loading a dataset", "until_ts": None, "effect": None, "nonce": "n1"})
    outcomes.refresh(store, policy, NOW + 30 * 300, run_id="n2")
    outcomes.refresh(store, policy, NOW + 29 * 300, run_id="n1-retry")  # an older instant, run again late
    got = {r["target"]: r for r in store.fetch("outcomes_between", {"since": NOW - 1, "until": NOW + 1})}
    assert (got["job:1003"]["outcome"], got["job:1003"]["run_id"]) == ("wrong", "n2")
    assert got[proc["target"]]["outcome"] == "acted" and got[proc["target"]]["after_s"] == 60


# -- training ------------------------------------------------------------------------------------------
def labelled_history(policy: Policy, store: AuditStore, n: int = 40) -> None:
    """Notices like the real one on 1003: half with memory resident that went back to work, half empty that stayed idle."""
    d = notice_on_1003(policy, store)
    fp = copies(d, n // 2, start=NOW - 5 * 86400, every=3 * 3600, mem_min_mib=30000.0, confidence=0.6)
    ok = copies(d, n // 2, start=NOW - 5 * 86400 + 1800, every=3 * 3600, mem_min_mib=0.0, confidence=0.95)
    store.record_decisions(fp + ok, "hist")
    rows = []
    for x in fp:
        rows += [usage(str(x.job_id), x.ts + k * 300, 2 if k == 6 else 0) for k in range(1, 30)]
    for x in ok:
        rows += [usage(str(x.job_id), x.ts + k * 300, 0) for k in range(1, 30)]
    store.execute("upsert_job_usage", rows)


def test_too_few_labels_means_no_model_is_used(store: AuditStore) -> None:
    policy = parse_policy("mode: enforce\nverifier: {min_labels: 200, horizon: 2h}\n")
    labelled_history(policy, store)
    row = verifier.train(store, policy, NOW)
    assert row["status"] == "too_few_labels" and row["labels"] == 40 and "200" in row["note"]
    assert verifier.active_model(store, policy, NOW + 1) is None
    f = next(x for x in sweep.detect(sweep.collect(policy, NOW + 1, "sim"), policy) if x.target == "job:1003")
    assert "verifier" not in verifier.annotate([f], policy, store, NOW + 1)[0].evidence


def test_a_model_learns_the_labels_and_scores_without_scikit_learn(policy: Policy, store: AuditStore) -> None:
    labelled_history(policy, store)
    row = verifier.train(store, policy, NOW)
    assert row["status"] == "active" and (row["labels"], row["false_positives"], row["confirmed"]) == (40, 20, 20)
    assert row["backtest_precision"] is not None and row["backtest_recall"] is not None
    model = verifier.active_model(store, policy, NOW + 1)
    assert model is not None and model["features"] == list(verifier.FEATURES)
    stored = store.query("SELECT model FROM gpu_cost_verifier_models")[0]["model"]
    assert set(json.loads(stored)) >= {"features", "mean", "scale", "coef", "intercept"}  # JSON, not a pickle
    f = next(x for x in sweep.detect(sweep.collect(policy, NOW + 1, "sim"), policy) if x.target == "job:1003")
    resident = dataclasses.replace(f, evidence={**f.evidence, "mem_min_mib": 30000.0, "confidence": 0.6})
    empty = dataclasses.replace(f, evidence={**f.evidence, "mem_min_mib": 0.0, "confidence": 0.95})
    a, b = verifier.annotate([resident, empty], policy, store, NOW + 1)
    assert a.evidence["verifier"]["model"] == row["model_id"]
    assert a.evidence["verifier"]["p_waste"] < 0.5 < b.evidence["verifier"]["p_waste"]


def test_the_numpy_score_is_the_fitted_regression() -> None:
    from sklearn.linear_model import LogisticRegression

    rng = np.random.default_rng(3)
    x = rng.normal(size=(200, len(verifier.FEATURES))) * 3 + 1
    y = (x[:, 0] - x[:, 5] + rng.normal(size=200) > 0).astype(int)
    model = verifier.fit(x, y)
    ref = LogisticRegression(C=1.0, max_iter=2000).fit((x - x.mean(0)) / x.std(0), y)
    want = ref.predict_proba((x[:5] - x.mean(0)) / x.std(0))[:, 1]
    got = [verifier.probability(model, list(r)) for r in x[:5]]
    assert np.allclose(got, want, atol=1e-4)


# -- the gate --------------------------------------------------------------------------------------------
def _finding(policy: Policy, p_waste: float | None) -> Any:
    f = next(x for x in sweep.detect(sweep.collect(policy, NOW, "sim"), policy) if x.target == "job:1003")
    if p_waste is None:
        return f
    return dataclasses.replace(f, evidence={**f.evidence, "verifier": {"p_waste": p_waste, "model": "m1"}})


@pytest.mark.parametrize(("p_waste", "action", "held"), [
    (0.2, "terminate", True), (0.49, "demote", True), (0.8, "terminate", False), (None, "terminate", False),
    (0.01, "notify", False), (0.01, "notify_manager", False),
], ids=["low-terminate", "low-demote", "high-terminate", "unscored", "low-notify", "low-notify-manager"])
def test_the_gate_holds_only_destructive_rungs_below_the_threshold(policy: Policy, p_waste: float | None, action: str,
                                                                   held: bool) -> None:
    v = guard(_finding(policy, p_waste), action, policy, now=NOW)
    assert v.requires_approval is held
    assert any("verifier.min_probability" in r for r in v.reasons) is held
    assert v.action == action  # it holds for a human; it never changes or causes an action


def test_on_doubt_wait_holds_the_rung_back_instead_of_asking(policy: Policy) -> None:
    wait = parse_policy("mode: enforce\nverifier: {on_doubt: wait}\n")
    v = guard(_finding(wait, 0.1), "terminate", wait, now=NOW)
    assert v.mode == "dry-run" and v.track == "shadow" and not v.requires_approval
    assert any("verifier.min_probability" in r and "waits (would terminate)" in r for r in v.reasons)
    sure = guard(_finding(wait, 0.9), "terminate", wait, now=NOW)
    assert sure.mode == "enforce" and sure.track == "live"
    notice = guard(_finding(wait, 0.1), "notify", wait, now=NOW)
    assert notice.mode == "enforce" and not notice.reasons


def test_the_gate_is_off_when_the_policy_says_so(policy: Policy) -> None:
    off = parse_policy("mode: enforce\nverifier: {enabled: false}\n")
    assert not guard(_finding(off, 0.01), "terminate", off, now=NOW).requires_approval


def test_the_sweep_scores_findings_and_the_engine_holds_the_kill(store: AuditStore) -> None:
    policy = parse_policy("""
mode: enforce
verifier: {min_labels: 20, horizon: 2h}
rules:
  idle_allocation:
    ladder: [{action: notify}, {action: terminate, after: 10m}]
""")
    labelled_history(policy, store)
    assert verifier.train(store, policy, NOW)["status"] == "active"
    # the notice was carried out (as the dispatcher records it): the next sweep is at the terminate rung
    first = store.fetch("decisions_of_run", {"run_id": "s0"})
    d = next(r for r in first if r["target"] == "job:1003")
    store.execute("advance_escalation", {"rule": d["rule"], "target": d["target"], "track": "live",
                                         "episode": d["episode"], "rung": d["rung"], "now": NOW})
    snap = sweep.collect(policy, NOW + 900, "sim")
    findings = sweep.detect(snap, policy)
    f = next(x for x in findings if x.target == "job:1003")
    looks_busy = dataclasses.replace(f, evidence={**f.evidence, "mem_min_mib": 30000.0, "confidence": 0.6})
    held = next(x for x in sweep.plan([looks_busy], snap, policy, store, NOW + 900, {}).decisions)
    assert held.action == "terminate" and held.requires_approval
    assert held.evidence["verifier"]["p_waste"] < 0.5 and "verifier.min_probability" in held.reason
    looks_idle = dataclasses.replace(f, evidence={**f.evidence, "mem_min_mib": 0.0, "confidence": 0.95})
    acts = next(x for x in sweep.plan([looks_idle], snap, policy, store, NOW + 900, {}).decisions)
    assert acts.action == "terminate" and not acts.requires_approval and acts.evidence["verifier"]["p_waste"] > 0.5


# -- the command line -------------------------------------------------------------------------------------
def test_the_verifier_commands_train_and_show(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    from gpu_cost.cli.main import main

    url = f"sqlite:///{tmp_path / 'audit.db'}"
    policy_file = tmp_path / "p.yaml"
    policy_file.write_text(POLICY)
    labelled_history(parse_policy(POLICY), AuditStore(url).ensure_schema())
    assert main(["verifier", "show", "--db", url, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["models"] == []
    assert main(["verifier", "train", "--db", url, "--policy", str(policy_file), "--at", str(NOW), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["status"] == "active" and out["labels"] == 40 and "model" not in out
    assert out["outcomes"]["active_again"] == 20
    assert main(["verifier", "show", "--db", url]) == 0
    text = capsys.readouterr().out
    assert out["model_id"] in text and "40 labels (20 false positives, 20 confirmed)" in text


def test_a_fit_that_cannot_score_is_stored_refused_and_the_last_good_model_goes_on(
        policy: Policy, store: AuditStore) -> None:
    labelled_history(policy, store)
    good = verifier.train(store, policy, NOW)
    assert good["status"] == "active"
    # later decisions whose evidence carries a number too large to standardise (a corrupt exporter value):
    # the mean overflows, and the fit would give a model the sweep refuses, or none at all
    d = Decision.from_row(store.get_decision(next(r["decision_id"] for r in store.decisions_of_run("s0")
                                                  if r["target"] == "job:1003")) or {})
    bad = copies(d, 30, start=NOW + 600, every=60, mem_min_mib=1.0, util_mean=1e308)
    store.record_decisions(bad, "later")
    store.execute("upsert_job_usage", [usage(str(x.job_id), x.ts + k * 300, 0) for x in bad for k in range(1, 30)])
    row = verifier.train(store, policy, NOW + 4 * 3600)
    assert row["status"] == "refused" and "cannot score" in row["note"] and row["labels"] > good["labels"]
    stored = store.query(f"SELECT model FROM gpu_cost_verifier_models WHERE model_id = '{row['model_id']}'")
    assert stored[0]["model"] is None
    model, problems = verifier.load_model(store, policy, NOW + 4 * 3600 + 1)
    assert model is not None and model["model_id"] == good["model_id"] and problems == []
