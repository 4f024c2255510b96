"""A malformed verifier model is refused where it is loaded: the sweep goes on with the last good one.

A model with NaN coefficients scored every finding ``p_waste = 1.0`` (the gate silently off); one
whose arrays differ in length made every sweep fail until retrained. Real sweeps of the simulated
cluster on a real SQLite audit store; the models are rows as ``verifier.train`` stores them.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from gpu_cost.audit.store import AuditStore
from gpu_cost.config.loader import parse_policy
from gpu_cost.config.schema import Policy
from gpu_cost.learn import verifier
from gpu_cost.loop import sweep

NOW = 1_800_000_000.0
N = len(verifier.FEATURES)
#: a good model scores every finding 1 / (1 + e) = 0.269: all weights zero, intercept -1
GOOD_P = round(1 / (1 + math.e), 3)


@pytest.fixture
def policy() -> Policy:
    return parse_policy("mode: enforce\nverifier: {min_labels: 20, horizon: 2h}\n")


@pytest.fixture
def store() -> AuditStore:
    return AuditStore("sqlite:///:memory:").ensure_schema()


def model(**change: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {"kind": "logistic", "version": 1, "features": list(verifier.FEATURES), "mean": [0.0] * N,
                           "scale": [1.0] * N, "coef": [0.0] * N, "intercept": -1.0}
    doc.update(change)
    return doc


def store_model(store: AuditStore, model_id: str, trained_at: float, doc: dict[str, Any] | str | None,
                status: str = "active") -> None:
    store.execute("insert_verifier_model", {
        "model_id": model_id, "trained_at": trained_at, "since_ts": trained_at - 86400, "until_ts": trained_at,
        "labels": 40, "false_positives": 20, "confirmed": 20, "backtest_precision": None, "backtest_recall": None,
        "false_kills_prevented": None, "gpu_hours_given_up": None, "status": status, "note": "",
        "model": doc if isinstance(doc, str | None) else json.dumps(doc), "run_id": None})


def without(key: str) -> dict[str, Any]:
    doc = model()
    del doc[key]
    return doc


BAD = [
    ("nan-coef", model(coef=[math.nan] + [0.0] * (N - 1)), "coef[0] is nan"),
    ("inf-intercept", model(intercept=math.inf), "intercept is inf"),
    ("short-coef", model(coef=[0.0] * (N - 1)), f"coef has {N - 1} numbers, features has {N}"),
    ("long-mean", model(mean=[0.0] * (N + 3)), f"mean has {N + 3} numbers, features has {N}"),
    ("zero-scale", model(scale=[1.0, 1.0, 0.0] + [1.0] * (N - 3)), "scale[2] is 0"),
    ("text-coef", model(coef=["0.1"] + [0.0] * (N - 1)), "coef[0] is not a number"),
    ("unknown-version", model(version=2), "version 2 is unknown"),
    ("unknown-kind", model(kind="forest"), "kind 'forest' is unknown"),
    ("missing-key", without("scale"), "missing scale"),
    ("unknown-feature", model(features=["gpu_temp", *verifier.FEATURES[1:]]), "unknown feature 'gpu_temp'"),
    ("not-json", "{\"coef\": [", "not JSON"),
    ("no-model", None, "no model JSON"),
]


@pytest.mark.parametrize(("doc", "why"), [(d, w) for _, d, w in BAD], ids=[i for i, _, _ in BAD])
def test_a_malformed_model_is_refused_and_the_sweep_scores_with_the_last_good_one(
        policy: Policy, store: AuditStore, doc: Any, why: str) -> None:
    store_model(store, "verifier-good", NOW - 86400, model())
    store_model(store, "verifier-bad", NOW - 3600, doc)
    out = sweep.run_once(policy, NOW, store, source="sim", run_id="s1")
    run = store.get_run("s1")
    assert run is not None and run["status"] == "ok"
    problems = json.loads(run["problems"])
    assert problems == out["problems"] and len(problems) == 1
    assert problems[0].startswith(f"verifier: model verifier-bad refused ({why}")
    assert problems[0].endswith("scoring with verifier-good, the last good model")
    scored = [d for d in out["decisions"] if d["target"] == "job:1003"]
    assert scored
    for d in scored:
        ev = (store.get_decision(d["decision_id"]) or {})["evidence"]
        ev = json.loads(ev) if isinstance(ev, str) else ev
        assert ev["verifier"]["model"] == "verifier-good" and ev["verifier"]["p_waste"] == GOOD_P


def test_with_no_good_model_findings_go_unscored_and_the_run_says_so(policy: Policy, store: AuditStore) -> None:
    store_model(store, "verifier-old", NOW - 2 * 86400, model(coef=[0.0] * 3))
    store_model(store, "verifier-bad", NOW - 3600, model(coef=[math.nan] * N))
    out = sweep.run_once(policy, NOW, store, source="sim", run_id="s1")
    run = store.get_run("s1")
    assert run is not None and run["status"] == "ok"
    problems = json.loads(run["problems"])
    assert [p.split(" refused ")[0] for p in problems] == ["verifier: model verifier-bad", "verifier: model verifier-old"]
    assert problems[-1].endswith("no usable model: job findings are not scored, the rules and the other guards decide")
    for d in out["decisions"]:
        ev = (store.get_decision(d["decision_id"]) or {})["evidence"]
        assert "verifier" not in (json.loads(ev) if isinstance(ev, str) else ev)


def test_a_model_that_was_not_active_still_means_no_model(policy: Policy, store: AuditStore) -> None:
    # as before: the newest model decides; a malformed row is as if it had never been stored
    store_model(store, "verifier-good", NOW - 3 * 86400, model())
    store_model(store, "verifier-few", NOW - 2 * 86400, None, status="too_few_labels")
    store_model(store, "verifier-bad", NOW - 3600, model(intercept=math.nan))
    chosen, problems = verifier.load_model(store, policy, NOW)
    assert chosen is None and len(problems) == 1 and "verifier-bad refused (intercept is nan)" in problems[0]


def test_a_model_stored_before_versions_is_read_as_version_1(policy: Policy, store: AuditStore) -> None:
    store_model(store, "verifier-v0", NOW - 3600, without("version"))
    chosen, problems = verifier.load_model(store, policy, NOW)
    assert chosen is not None and chosen["model_id"] == "verifier-v0" and problems == []
    assert verifier.active_model(store, policy, NOW) == chosen


def test_training_stores_the_version(policy: Policy) -> None:
    import numpy as np

    rng = np.random.default_rng(1)
    x = rng.normal(size=(60, N))
    fitted = verifier.fit(x, (x[:, 0] > 0).astype(int))
    assert fitted["version"] == verifier.MODEL_VERSION and verifier.check_model(fitted) is fitted
