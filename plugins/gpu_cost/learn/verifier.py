"""The verifier: a model, learnt from outcomes, of the chance that a finding is waste.

Features come from each decision's evidence (utilisation and memory, bursts, the confidence, the
job's log state, its class and how it differs from a training job's, job age and time limit, the
hour of day) and from the owner's history (the share of their earlier labelled decisions that were
false positives, known before the decision). Labels come from :mod:`gpu_cost.learn.outcomes`: active
again within the horizon or answered "this is wrong" is a false positive, ended or still idle is
waste confirmed.

Training (nightly, ``gpu-cost verifier train``) fits a standardised logistic regression with
scikit-learn, backtests it on a time split (trained on the older labels known by the split,
tested on the newer ones) and stores every model in ``gpu_cost_verifier_models`` as JSON (feature
names, means, scales, coefficients, intercept; never a pickle). Scoring at sweep time
(:func:`annotate`) is plain numpy. A model with fewer than ``verifier.min_labels`` labels is
stored with status ``too_few_labels`` and never used.

A stored model is checked where the sweep loads it (:func:`check_model`: known version and kind,
every key, known features, arrays as long as the feature list, finite numbers, positive scales).
A malformed one is refused and named in the run's problems, and the sweep scores with the last
good model before it, as if the malformed row had never been stored; with none, findings go
unscored. Unscored is the verifier off: it only ever holds a destructive rung back, so a missing
score never makes an action more likely than the rules and the other guards make it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from gpu_cost.audit.store import AuditStore
from gpu_cost.config.schema import Policy
from gpu_cost.core.errors import GpuCostError
from gpu_cost.core.model import DESTRUCTIVE_ACTIONS, KILL_ACTIONS, Finding
from gpu_cost.learn import outcomes

logger = logging.getLogger(__name__)

#: the rules whose findings say "idle": their targets going back to work is what a false positive is
#: (a low-efficiency job is busy by definition, an anomaly is advice)
RULES = ("idle_allocation", "idle_interactive")
FEATURES = (
    "util_mean", "util_max", "util_max_lookback", "mem_gib_log", "mem_known", "bursts_lookback", "confidence",
    "runtime_h_log", "limit_h_log", "limit_known", "elapsed_share", "hour_sin", "hour_cos", "weekend",
    "log_finished", "log_crashed", "log_waiting", "class_known", "class_service", "class_busy_share",
    "class_waking_share", "class_mem_resident_share", "interactive", "inference", "gpus_log",
    "owner_fp_share", "owner_labels_log", *(f"rule_{r}" for r in RULES),
)
#: the fewest labels of each kind a model needs besides ``verifier.min_labels``
MIN_PER_CLASS = 5
#: statuses of a stored model; only ``active`` is ever used
STATUSES = ("active", "too_few_labels", "one_class", "refused")
#: the layout of the model JSON this code writes and scores (a model stored without one is version 1)
MODEL_VERSION = 1
#: how many stored models back the sweep looks for a good one when the newest are malformed
MODEL_HISTORY = 30
_ARRAYS = ("mean", "scale", "coef")


class ModelError(GpuCostError):
    """A stored verifier model is malformed: it is never scored with."""


def _num(v: Any, default: float = 0.0) -> float:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return default
    return x if math.isfinite(x) else default


def owner_share(fp: int, n: int) -> float:
    """Return the owner's false-positive share, smoothed toward an even prior (no history: 0.5)."""
    return (fp + 1.0) / (n + 2.0)


def features(evidence: Mapping[str, Any], *, rule: str, gpus: int, ts: float,
             owner: tuple[int, int] = (0, 0)) -> list[float]:
    """Return the feature vector (:data:`FEATURES` order) of one finding or decision.

    :param owner: (false positives, labels) of the owner's earlier decisions known at ``ts``.
    """
    ev = evidence
    mem = ev.get("mem_min_mib")
    runtime = _num(ev.get("runtime_s"))
    limit = _num(ev.get("time_limit_s"))
    klass = ev.get("class") if isinstance(ev.get("class"), Mapping) else None
    hour = (ts % 86400.0) / 3600.0
    day = int(ts // 86400.0 + 3) % 7  # 1970-01-01 was a Thursday: 0 = Monday
    log = ev.get("log_state")
    fp, n = owner
    x = {
        "util_mean": _num(ev.get("util_mean")), "util_max": _num(ev.get("util_max")),
        "util_max_lookback": _num(ev.get("util_max_lookback")),
        "mem_gib_log": math.log1p(max(0.0, _num(mem)) / 1024.0), "mem_known": float(mem is not None),
        "bursts_lookback": _num(ev.get("bursts_lookback")), "confidence": _num(ev.get("confidence"), 0.7),
        "runtime_h_log": math.log1p(max(0.0, runtime) / 3600.0),
        "limit_h_log": math.log1p(max(0.0, limit) / 3600.0), "limit_known": float(limit > 0),
        "elapsed_share": min(1.5, runtime / limit) if limit > 0 else 0.0,
        "hour_sin": math.sin(2 * math.pi * hour / 24), "hour_cos": math.cos(2 * math.pi * hour / 24),
        "weekend": float(day >= 5),
        "log_finished": float(log == "finished"), "log_crashed": float(log == "crashed"),
        "log_waiting": float(log == "waiting"),
        "class_known": float(klass is not None),
        "class_service": float(bool(klass) and "service" in (klass.get("kind"), klass.get("member_kind"))),  # type: ignore[union-attr]
        "class_busy_share": _num((klass or {}).get("busy_share")),
        "class_waking_share": _num((klass or {}).get("waking_share")),
        "class_mem_resident_share": _num((klass or {}).get("mem_resident_share")),
        "interactive": float(bool(ev.get("interactive"))), "inference": float(bool(ev.get("inference"))),
        "gpus_log": math.log1p(max(0, int(gpus or 0))),
        "owner_fp_share": owner_share(fp, n), "owner_labels_log": math.log1p(n),
    }
    for r in RULES:
        x[f"rule_{r}"] = float(rule == r)
    return [float(x[name]) for name in FEATURES]


def probability(model: Mapping[str, Any], x: Sequence[float]) -> float:
    """Return the model's chance that a finding with features ``x`` is waste (plain numpy)."""
    names = list(model["features"])
    vec = dict(zip(FEATURES, x, strict=True))
    z = (np.array([vec.get(n, 0.0) for n in names]) - np.array(model["mean"])) / np.array(model["scale"])
    logit = float(z @ np.array(model["coef"]) + float(model["intercept"]))
    return 1.0 / (1.0 + math.exp(-max(-50.0, min(50.0, logit))))


# -- the labelled set ---------------------------------------------------------------------------
def dataset(store: AuditStore, policy: Policy, now: float) -> list[dict[str, Any]]:
    """Return the labelled decisions of the last ``verifier.history``, oldest first, each with its
    ``x`` (features, the owner's history as known at the decision), ``y`` (1 waste, 0 false positive),
    ``ts``, ``known_ts`` (when the label became known), ``action``, ``target``, ``episode``, ``gpu_hours_saved``."""
    since = now - policy.verifier.history
    labels = {r["decision_id"]: r for r in store.fetch("outcomes_between", {"since": since, "until": now})}
    rows = [d for d in store.fetch("decisions_to_label", {"since": since, "until": now})
            if d["target_kind"] == "job" and d["rule"] in RULES and d["decision_id"] in labels]
    # the owner's history as each decision saw it: labels known (outcome_ts) before the decision
    known = sorted(((float(o["outcome_ts"]), str(o.get("user_name") or ""), outcomes.label_of(o["outcome"]))
                    for o in labels.values() if o.get("outcome_ts") is not None and o["rule"] in RULES
                    and outcomes.label_of(o["outcome"]) is not None), key=lambda k: k[0])
    out = []
    hist: dict[str, list[int]] = {}
    k = 0
    for d in rows:
        t = float(d["ts"])
        while k < len(known) and known[k][0] < t:
            h = hist.setdefault(known[k][1], [0, 0])
            h[0] += int(known[k][2] == 0)
            h[1] += 1
            k += 1
        o = labels[d["decision_id"]]
        y = outcomes.label_of(o["outcome"])
        if y is None or o.get("outcome_ts") is None:
            continue
        ev = d["evidence"]
        ev = json.loads(ev) if isinstance(ev, str) and ev else dict(ev or {})
        fp, n = hist.get(str(d.get("user_name") or ""), [0, 0])
        out.append({"decision_id": d["decision_id"], "ts": t, "known_ts": float(o["outcome_ts"]), "y": y,
                    "x": features(ev, rule=d["rule"], gpus=int(d["gpus"] or 0), ts=t, owner=(fp, n)),
                    "action": d["action"], "target": d["target"], "episode": int(d["episode"] or 1),
                    "gpu_hours_saved": _num(d.get("gpu_hours_saved")), "outcome": o["outcome"]})
    return out


def fit(x: np.ndarray, y: np.ndarray) -> dict[str, Any]:
    """Fit a standardised logistic regression; return it as JSON-ready numbers (scikit-learn only here)."""
    from sklearn.linear_model import LogisticRegression

    mean = x.mean(axis=0)
    scale = x.std(axis=0)
    scale[scale < 1e-9] = 1.0
    lr = LogisticRegression(C=1.0, max_iter=2000)
    lr.fit((x - mean) / scale, y)
    return {"kind": "logistic", "version": MODEL_VERSION, "features": list(FEATURES), "mean": [round(float(v), 6) for v in mean],
            "scale": [round(float(v), 6) for v in scale], "coef": [round(float(v), 6) for v in lr.coef_[0]],
            "intercept": round(float(lr.intercept_[0]), 6)}


def backtest(train_rows: Sequence[Mapping[str, Any]], test_rows: Sequence[Mapping[str, Any]],
             min_probability: float) -> dict[str, Any]:
    """Fit on ``train_rows``, score ``test_rows``; return precision and recall of the holds (a hold: p_waste
    below ``min_probability``; right when the decision was a false positive), the false kills the gate
    would have prevented and the GPU-hours of confirmed waste it would have given up (per episode: its
    first destructive decision held keeps the ladder from reaching the kill)."""
    model = fit(np.array([r["x"] for r in train_rows]), np.array([r["y"] for r in train_rows]))
    p = np.array([probability(model, r["x"]) for r in test_rows])
    y = np.array([r["y"] for r in test_rows])
    held = p < min_probability
    fp = y == 0
    out: dict[str, Any] = {
        "n_train": len(train_rows), "n_test": len(test_rows),
        "precision": round(float((held & fp).sum() / held.sum()), 3) if held.sum() else None,
        "recall": round(float((held & fp).sum() / fp.sum()), 3) if fp.sum() else None,
    }
    episodes: dict[tuple[str, int], dict[str, Any]] = {}
    for r, pr in zip(test_rows, p, strict=True):
        if r["action"] not in DESTRUCTIVE_ACTIONS:
            continue
        e = episodes.setdefault((r["target"], r["episode"]), {"held": None, "kill": None, "y": r["y"]})
        if e["held"] is None:
            e["held"] = bool(pr < min_probability)
        if r["action"] in KILL_ACTIONS and e["kill"] is None:
            e["kill"] = r
    prevented = sum(1 for e in episodes.values() if e["kill"] and e["held"] and e["y"] == 0)
    given_up = sum(e["kill"]["gpu_hours_saved"] for e in episodes.values() if e["kill"] and e["held"] and e["y"] == 1)
    out.update({"false_kills_prevented": prevented, "gpu_hours_given_up": round(float(given_up), 2),
                "kills_false": sum(1 for e in episodes.values() if e["kill"] and e["y"] == 0),
                "kills_confirmed": sum(1 for e in episodes.values() if e["kill"] and e["y"] == 1)})
    return out


def train(store: AuditStore, policy: Policy, now: float, run_id: str | None = None, *,
          refresh_outcomes: bool = True) -> dict[str, Any]:
    """Label the recent decisions, train and backtest a model, store it; return its row (without the JSON).

    :param refresh_outcomes: compute the outcomes first (:func:`gpu_cost.learn.outcomes.refresh`).
    """
    cfg = policy.verifier
    counts = outcomes.refresh(store, policy, now, run_id=run_id) if refresh_outcomes else {}
    rows = dataset(store, policy, now)
    n = len(rows)
    n_fp = sum(1 for r in rows if r["y"] == 0)
    row: dict[str, Any] = {
        "trained_at": now, "since_ts": rows[0]["ts"] if rows else None, "until_ts": rows[-1]["ts"] if rows else None,
        "labels": n, "false_positives": n_fp, "confirmed": n - n_fp, "backtest_precision": None,
        "backtest_recall": None, "false_kills_prevented": None, "gpu_hours_given_up": None, "model": None,
        "run_id": run_id,
    }
    if n < cfg.min_labels:
        row.update(status="too_few_labels", note=f"{n} labels, verifier.min_labels is {cfg.min_labels}: not used")
    elif min(n_fp, n - n_fp) < MIN_PER_CLASS:
        row.update(status="one_class", note=f"{n_fp} false positives and {n - n_fp} confirmed: at least "
                                             f"{MIN_PER_CLASS} of each are needed; not used")
    else:
        cut_ts = rows[min(n - 1, int(n * (1 - cfg.test_share)))]["ts"]
        # train on what was known at the split: older decisions whose label had come in by then
        older = [r for r in rows if r["ts"] < cut_ts and r["known_ts"] <= cut_ts]
        newer = [r for r in rows if r["ts"] >= cut_ts]
        note = f"trained on {n} labels; backtest split at {cut_ts:.0f}"
        if len({r["y"] for r in older}) == 2 and newer:
            bt = backtest(older, newer, cfg.min_probability)
            row.update(backtest_precision=bt["precision"], backtest_recall=bt["recall"],
                       false_kills_prevented=bt["false_kills_prevented"], gpu_hours_given_up=bt["gpu_hours_given_up"])
            note += f" ({bt['n_train']} older, {bt['n_test']} newer)"
        else:
            note += ": too few older labels of both kinds for a backtest"
        try:
            # the model is checked as the sweep checks it where it loads it: never stored active to be refused there
            with np.errstate(over="ignore", invalid="ignore"):
                model = check_model(fit(np.array([r["x"] for r in rows]), np.array([r["y"] for r in rows])))
        except (ModelError, ValueError) as exc:
            row.update(status="refused", note=f"{note}: the fitted model cannot score ({exc}); not used, the last "
                                              "good model goes on")
        else:
            model.update(horizon_s=cfg.horizon, trained_at=now)
            row.update(status="active", note=note, model=json.dumps(model, sort_keys=True))
    digest = hashlib.sha256(json.dumps({k: row[k] for k in ("labels", "false_positives", "model")},
                                       sort_keys=True, default=str).encode()).hexdigest()[:8]
    row["model_id"] = f"verifier-{int(now)}-{digest}"
    store.execute("insert_verifier_model", row)
    logger.info("verifier %s: %s (%d labels, %d false positives)", row["model_id"], row["status"], n, n_fp)
    return {**{k: v for k, v in row.items() if k != "model"}, "outcomes": counts}


# -- scoring at sweep time ------------------------------------------------------------------------
def check_model(model: Any) -> dict[str, Any]:
    """Return ``model`` (a stored model's JSON, parsed) when it can be scored with; ModelError saying what is wrong.

    Refused: another version or kind, a missing key, a feature this code does not compute (or one
    listed twice), arrays whose length is not the feature list's, a number that is not finite (NaN
    scores every finding 1.0), a scale that is not positive.
    """
    if not isinstance(model, dict):
        raise ModelError(f"a JSON object expected, not {type(model).__name__}")
    version = model.get("version", 1)  # models stored before the version key are version 1
    if version != MODEL_VERSION or isinstance(version, bool):
        raise ModelError(f"version {version!r:.20} is unknown (this agent reads {MODEL_VERSION})")
    missing = [k for k in ("kind", "features", *_ARRAYS, "intercept") if k not in model]
    if missing:
        raise ModelError(f"missing {', '.join(missing)}")
    if model["kind"] != "logistic":
        raise ModelError(f"kind {model['kind']!r:.20} is unknown (this agent scores logistic)")
    names = model["features"]
    if not isinstance(names, list) or not names:
        raise ModelError("features is not a list of feature names")
    unknown = [n for n in names if n not in FEATURES]
    if unknown:
        raise ModelError(f"unknown feature {unknown[0]!r:.40}")
    if len(set(names)) != len(names):
        raise ModelError("a feature is listed twice")
    for key in _ARRAYS:
        values = model[key]
        if not isinstance(values, list):
            raise ModelError(f"{key} is not a list")
        if len(values) != len(names):
            raise ModelError(f"{key} has {len(values)} numbers, features has {len(names)}")
        for i, v in enumerate(values):
            _finite(v, f"{key}[{i}]")
            if key == "scale" and v <= 0:
                raise ModelError(f"scale[{i}] is {v:g}: must be positive")
    _finite(model["intercept"], "intercept")
    return model


def _finite(v: Any, where: str) -> None:
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise ModelError(f"{where} is not a number ({v!r:.20})")
    if not math.isfinite(v):
        raise ModelError(f"{where} is {v}")


def load_model(store: AuditStore, policy: Policy, now: float) -> tuple[dict[str, Any] | None, list[str]]:
    """Return the model the sweep uses at ``now`` and the problems met finding it (for the run's problems).

    The newest model trained by ``now`` decides: none when it is not ``active`` or has fewer labels
    than ``verifier.min_labels`` asks now. A malformed one (:func:`check_model`) is refused and
    skipped, as if never stored, to the one before it: the last good model, or none; so is one
    :func:`train` stored as ``refused`` (its fit could not score).
    """
    problems: list[str] = []
    chosen: dict[str, Any] | None = None
    for r in store.fetch("recent_verifier_models", {"until": now, "limit": MODEL_HISTORY}):
        if r["status"] == "refused":
            continue  # a fit that could not score (train says why): as if never stored, like a malformed one
        if r["status"] != "active" or int(r["labels"] or 0) < policy.verifier.min_labels:
            break
        try:
            if not r.get("model"):
                raise ModelError("no model JSON")
            try:
                doc = json.loads(r["model"])
            except ValueError:
                raise ModelError("not JSON") from None
            chosen = {**check_model(doc), "model_id": r["model_id"]}
            break
        except ModelError as exc:
            logger.error("verifier model %s refused: %s", r["model_id"], exc)
            problems.append(f"verifier: model {r['model_id']} refused ({exc})")
    if problems:
        problems[-1] += (f"; scoring with {chosen['model_id']}, the last good model" if chosen else
                         "; no usable model: job findings are not scored, the rules and the other guards decide")
    return chosen, problems


def active_model(store: AuditStore, policy: Policy, now: float) -> dict[str, Any] | None:
    """Return the model the sweep uses at ``now`` (:func:`load_model`), or None."""
    return load_model(store, policy, now)[0]


def annotate(findings: Sequence[Finding], policy: Policy, store: AuditStore, now: float,
             problems: list[str] | None = None) -> list[Finding]:
    """Return the findings with the model's score in ``evidence["verifier"]`` (job findings of the rules it
    knows); unchanged when the verifier is off or no model may be used.

    :param problems: where a refused model is said (the run's problems); it is logged either way.
    """
    findings = list(findings)
    if not policy.verifier.enabled:
        return findings
    model, refused = load_model(store, policy, now)
    if problems is not None:
        problems.extend(refused)
    scorable = [i for i, f in enumerate(findings) if f.target_kind == "job" and f.rule in RULES]
    if model is None or not scorable:
        return findings
    users = sorted({findings[i].user or "" for i in scorable})
    hist: dict[str, list[int]] = {}
    for o in store.fetch("outcomes_of_users", {"users": users, "until": now, "rules": list(RULES)}):
        h = hist.setdefault(str(o["user_name"] or ""), [0, 0])
        h[0] += int(o["outcome"] in outcomes.FALSE_POSITIVE)
        h[1] += 1
    for i in scorable:
        f = findings[i]
        fp, n = hist.get(f.user or "", [0, 0])
        ev = dict(f.evidence)
        if f.time_limit_s and "time_limit_s" not in ev:
            ev["time_limit_s"] = float(f.time_limit_s)
        p = probability(model, features(ev, rule=f.rule, gpus=f.gpus, ts=now, owner=(fp, n)))
        findings[i] = dataclasses.replace(f, evidence={**f.evidence, "verifier": {
            "p_waste": round(p, 3), "model": model["model_id"], "min_probability": policy.verifier.min_probability}})
    return findings


def models(store: AuditStore, limit: int = 10) -> list[dict[str, Any]]:
    """Return the newest stored models' figures (no JSON), newest first."""
    return store.fetch("verifier_models", {"limit": limit})
