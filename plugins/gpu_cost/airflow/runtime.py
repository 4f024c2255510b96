"""What every DAG task needs: the policy, the audit store and the data instant of the run."""

from __future__ import annotations

import datetime as dt
import itertools
import logging
import os
import re
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpu_cost.core import paths
from gpu_cost.core.errors import GpuCostError, PolicyError
from gpu_cost.core.timeutil import epoch

if TYPE_CHECKING:  # the store (SQLAlchemy) and the policy schema are imported where used: DAG files import
    # this module at parse time, and the DAG processor parses every file every few minutes
    from gpu_cost.audit.store import AuditStore
    from gpu_cost.config.schema import Policy

logger = logging.getLogger(__name__)


def schedule(var: str, default: str) -> str | None:
    """Return a DAG's cron schedule: ``default`` unless the environment variable ``var`` overrides it.

    ``none`` (or an empty value) leaves only manual triggers: test clusters and staging use it so
    that no scheduled run appears beside the runs they trigger. Read at parse time: no I/O.
    """
    chosen = os.environ.get(var, default).strip()
    return None if chosen.lower() in ("", "none") else chosen


def schedule_period(context: Mapping[str, Any], at: float) -> float | None:
    """Return the seconds between the runs the task's DAG is scheduled to make after ``at``; None: manual only.

    A cron schedule's typical (median) gap over its next 24 runs, a timedelta schedule's delta.
    """
    timetable = getattr(context.get("dag"), "timetable", None)
    delta = getattr(timetable, "delta", None)
    if isinstance(delta, dt.timedelta):
        return delta.total_seconds()
    expression = getattr(timetable, "expression", None)
    if not isinstance(expression, str):
        return None
    try:
        from croniter import croniter  # Airflow's own cron parser
    except ImportError:
        logger.debug("croniter is not installed: the period of %r is unknown", expression)
        return None
    it = croniter(expression, dt.datetime.fromtimestamp(at, dt.UTC))
    fires = [float(it.get_next(float)) for _ in range(25)]
    gaps = sorted(b - a for a, b in itertools.pairwise(fires))
    return gaps[len(gaps) // 2]


#: one part of a name a run may give: a file or folder of a configured root, never a path of its own
NAME_PART = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}"
#: a policy's name: a file of the policy directory, never a path
POLICY_NAME = re.compile(rf"^{NAME_PART}$")
#: a name under a configured root that may go down into folders (``team-a/2026``), never up or out
NESTED_NAME = re.compile(rf"^{NAME_PART}(/{NAME_PART}){{0,7}}$")
POLICY_SUFFIXES = (".yaml", ".yml")


class RunParamError(GpuCostError):
    """A run's param names something outside the root the deployment configured for it.

    :param param: the param's name; :param value: what the run gave; :param reason: why it is refused.
    """

    def __init__(self, param: str, value: object, reason: str) -> None:
        self.param = param
        self.value = value
        self.reason = reason
        super().__init__(f"param {param!r} = {value!r} refused: {reason}")


def under_root(root: Path | str, name: object, *, param: str, nested: bool = False) -> Path | str:
    """Return where the run's ``param`` value ``name`` lies under the configured ``root``.

    The one check for "a name under a configured root" (policies, report folders, traces): a name
    of ``[A-Za-z0-9_.-]`` parts (``nested``: up to 8 of them, joined by ``/``), never an absolute
    path, a URL, ``..``, or a symlink that leads out of the root. A URL ``root`` (object storage,
    chosen by the deployment) gets the name appended. Raises :class:`RunParamError` naming ``param``.
    """
    text = str(name) if name is not None else ""
    shape = NESTED_NAME if nested else POLICY_NAME
    if "://" in text:
        why = "a URL; give a name"
    elif text.startswith(("/", "\\", "~")):
        why = "an absolute path; give a name"
    elif ".." in text:
        why = "'..' is not allowed"
    elif not shape.fullmatch(text):
        why = ("not a name: use letters, digits, '_', '.', '-'" + (" and '/' between folders" if nested else "")
               + ", starting with a letter or digit")
    else:
        why = ""
    if why:
        raise RunParamError(param, name, f"{why} (a run names something under {root}, never a path)")
    if isinstance(root, str) and "://" in root:
        return f"{root.rstrip('/')}/{text}"
    base = Path(root)
    found = base / text
    real_root, real = base.resolve(), found.resolve()
    inside = real.parent == real_root if not nested else real_root in real.parents
    if not inside:
        raise RunParamError(param, name, f"it leads out of {base} (to {real}): a symlink out of the root is refused")
    return found


def policy_dir() -> Path:
    """Return the deployment's policy directory: the only place a run's ``policy`` param may name.

    ``GPU_COST_POLICY_DIR``; else the folder of ``GPU_COST_POLICY``; else the shipped ``include/policy``.
    """
    override = os.environ.get("GPU_COST_POLICY_DIR")
    if override:
        return Path(override)
    return paths.default_policy().parent


def policy_names() -> list[str]:
    """Return the names of the policies a run may ask for (file stems in :func:`policy_dir`)."""
    return named_files(policy_dir())


def named_files(folder: Path) -> list[str]:
    """Return the names a run may give for the YAML files of a configured ``folder`` (their stems)."""
    try:
        return sorted({p.stem for p in folder.iterdir() if p.suffix in POLICY_SUFFIXES and p.is_file()})
    except OSError:
        return []


def named_file(folder: Path, name: object, *, param: str) -> Path | None:
    """Return the YAML file of ``folder`` a run names (``default`` or ``default.yaml``, :func:`under_root`);
    None when the name is not one, or the folder holds no such file."""
    text = str(name)
    stem = text[: -len(next(s for s in POLICY_SUFFIXES if text.endswith(s)))] if text.endswith(POLICY_SUFFIXES) else text
    try:
        for suffix in POLICY_SUFFIXES:
            candidate = Path(under_root(folder, f"{stem}{suffix}", param=param))
            if candidate.is_file():
                return candidate
    except RunParamError:
        pass
    return None


#: the policies the package ships in ``include/policy/``, with what each is: constant for a release, so the
#: trigger forms offer them without listing a folder at parse time (a new file there would make a new
#: version of every DAG). A run may name any policy of :func:`policy_dir`; :func:`resolve_policy` checks it.
SHIPPED_POLICIES: dict[str, str] = {"default": "the shipped policy, dry-run: records what it would do, acts on nothing"}


def name_param(default: str | None, shipped: Mapping[str, str], *, title: str, what: str) -> Any:
    """Return a form field that names a file of a configured folder (a policy, a search space).

    Free text (the deployment's own names are typed) with the ``shipped`` names offered as suggestions
    and explained in the description. Nothing here reads the folder: the serialized DAG, and so its
    version, stays the same when files are added; the name is checked when the run starts. ``what``
    says which folder, and what an empty value means where ``default`` is None.
    """
    from airflow.sdk import Param

    offered = "; ".join(f"{name}: {label}" for name, label in shipped.items())
    return Param(default, type=["null", "string"] if default is None else "string", pattern=POLICY_NAME.pattern,
                 examples=list(shipped), title=title,
                 description=f"{what} Shipped with the package: {offered}. Type your deployment's own names; a "
                             "name the folder does not hold fails the run's first task, naming the ones it holds.")


def policy_param() -> Any:
    """Return the DAG param that names a run's policy: a name from the policy directory, never a path.

    The form suggests the shipped policies (:data:`SHIPPED_POLICIES`) and takes any name typed; the
    name is checked when the run starts (:func:`resolve_policy`), which pins the policy.
    """
    return name_param(None, SHIPPED_POLICIES, title="Policy",
                      what="A policy of the deployment's policy directory (GPU_COST_POLICY_DIR), by name, never a "
                           "path; empty: the deployment's default (GPU_COST_POLICY). The run pins it when it starts.")


def resolve_policy(name: str | None) -> Path:
    """Return the file of the policy ``name`` (None: the deployment's default, ``GPU_COST_POLICY``).

    A run names a policy of the policy directory (:func:`under_root`); a path, or a name the
    directory does not hold, is refused: the form must not be able to lower the bar by pointing
    at another file.
    """
    if not name:
        return paths.default_policy()
    text = str(name)
    folder = policy_dir()
    found = named_file(folder, text, param="policy")
    if found is not None:
        return found
    offered = ", ".join(policy_names()) or "none"
    raise PolicyError(text, "policy", f"not a policy of the deployment's policy directory {folder} "
                                      f"(a run names a policy, never a path; available: {offered})")


def policy_from(params: Mapping[str, Any] | None = None) -> Policy:
    """Load the policy named by the run's ``policy`` param, else ``GPU_COST_POLICY`` or the default."""
    from gpu_cost.config.loader import load_policy

    return load_policy(resolve_policy((params or {}).get("policy")))


def pin_policy(store: AuditStore, run_id: str, params: Mapping[str, Any] | None = None) -> Policy:
    """Pin the run's policy in the audit store (content and hash) and return it.

    The first task of a run calls this; every later task, and an approval answered later, reads
    the same content back with :func:`run_policy`, so an edit of the file mid-run changes nothing.
    Pinning again (a retried task) returns what was pinned first.
    """
    from gpu_cost.config.loader import parse_policy

    rows = store.fetch("pinned_policy", {"run_id": run_id})
    if not rows:
        path = resolve_policy((params or {}).get("policy"))
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise PolicyError(str(path), "", f"cannot read: {exc.strerror or exc}") from None
        parse_policy(text, str(path))  # a bad file fails here, before anything is pinned
        store.execute("pin_policy", {"run_id": run_id, "name": path.stem, "sha256": _sha256(text),
                                     "content": text, "pinned_at": time.time()})
    return run_policy(store, run_id)


def run_policy(store: AuditStore, run_id: str) -> Policy:
    """Return the policy pinned for ``run_id``; raise PolicyError when the run pinned none."""
    from gpu_cost.config.loader import parse_policy

    rows = store.fetch("pinned_policy", {"run_id": run_id})
    if not rows:
        raise PolicyError(run_id, "policy", "this run pinned no policy (its first task did not run)")
    row = rows[0]
    if _sha256(row["content"]) != row["sha256"]:
        raise PolicyError(run_id, "policy", "the pinned policy's content does not match its hash")
    return parse_policy(row["content"], f"{row['name']} (sha256 {row['sha256'][:12]}, pinned for {run_id})")


def _sha256(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode("utf-8")).hexdigest()


#: the word a data source field offers for "what the deployment configured"; an older run's None (or no
#: ``source`` at all, from the REST API or the CLI) means the same
CONFIGURED_SOURCE = "configured"
#: where the configured source comes from before the policy's ``sweep.source``
SOURCE_ENV: tuple[str, ...] = ("GPU_COST_SOURCE",)
#: what each data source a run may choose reads, in the forms' words
SOURCE_LABELS: dict[str, str] = {
    "sim": "Simulator (sim)",
    "prometheus": "Prometheus GPU metrics (prometheus)",
    "slurm": "Slurm alone: nodes and jobs, no GPU metrics (slurm)",
    "store": "The audit store's own job rows (store)",
    "trace": "A jobs trace of the trace folder (trace)",
}


def source_param(choices: Sequence[str], *, env: Sequence[str] = SOURCE_ENV,
                 what: str = "Where the run reads the cluster from") -> Any:
    """Return a DAG's "Data source" field: ``configured`` (the default) or one of ``choices``, each with a label.

    The one form of every DAG's source param. None stays valid for a run triggered through the REST
    API or the CLI with an older conf (it is listed last, labelled, so the form never shows "null");
    :func:`source_from` maps both back to ``env``, else the policy's ``sweep.source``.
    """
    from airflow.sdk import Param

    unknown = [c for c in choices if c not in SOURCE_LABELS]
    if unknown:
        raise ValueError(f"no label for the data source(s) {', '.join(unknown)}: add them to SOURCE_LABELS")
    where = ", else ".join([*env, "the policy's sweep.source"])
    display = {CONFIGURED_SOURCE: f"As configured ({where})", **{c: SOURCE_LABELS[c] for c in choices},
               "null": "Not set: as configured"}
    return Param(CONFIGURED_SOURCE, type=["null", "string"], enum=[CONFIGURED_SOURCE, *choices, None],
                 values_display=display, title="Data source",
                 description=f"{what}; \"As configured\": {where}.")


def asked_source(params: Mapping[str, Any] | None = None, *, env: Sequence[str] = SOURCE_ENV) -> str | None:
    """Return the data source the run's ``source`` param or the deployment (the first of ``env`` set) names.

    None: neither does, and the policy's ``sweep.source`` is the run's (a run refused before its
    policy loaded records no source rather than the form's word ``configured``).
    """
    asked = (params or {}).get("source")
    if asked and asked != CONFIGURED_SOURCE:
        return str(asked)
    for var in env:
        if os.environ.get(var):
            return str(os.environ[var])
    return None


def source_from(policy: Policy, params: Mapping[str, Any] | None = None, *, env: Sequence[str] = SOURCE_ENV) -> str:
    """Return the run's data source: its ``source`` param, else the first of ``env`` set, else the policy's.

    ``configured`` (the forms' default), None and an absent param all mean "as configured".
    """
    return asked_source(params, env=env) or str(policy.sweep.source)


def data_instant(context: Mapping[str, Any], policy: Policy) -> float:
    """Return the instant a run looks at: the end of its data interval, else when it was due.

    Floored to the sample interval so a retried task sees exactly the same data window.
    """
    candidates = [context.get("data_interval_end"), context.get("logical_date")]
    dag_run = context.get("dag_run")
    if dag_run is not None:
        candidates.append(getattr(dag_run, "run_after", None))
    for value in candidates:
        if value is not None:
            t = epoch(value)
            step = policy.sweep.sample_interval
            return float(t // step * step)
    raise RuntimeError("the run has neither a data interval nor a run_after instant")


def audit_run_id(context: Mapping[str, Any]) -> str:
    """Return the audit store's id for this DAG run."""
    dag_run = context.get("dag_run")
    dag_id = getattr(dag_run, "dag_id", None) or context.get("dag").dag_id  # type: ignore[union-attr]
    run_id = getattr(dag_run, "run_id", None) or context.get("run_id")
    return f"{dag_id}:{run_id}"


def store() -> AuditStore:
    """Return the audit store (connection ``gpu_cost_db``), schema ensured."""
    from gpu_cost.audit.store import AuditStore

    return AuditStore().ensure_schema()


def release_parked(store: AuditStore, policy: Policy, now: float) -> int:
    """At a run's end: empty the parked state (snapshots, findings, plans) of data instants more than the policy's
    ``sweep.keep_parked`` before ``now`` (the run's data instant); return how many. A failure is logged, never the
    run's: the state is released at the next run's end."""
    try:
        released = store.release_parked(now - policy.sweep.keep_parked)
    except GpuCostError:
        logger.exception("the parked state before %s could not be released", now - policy.sweep.keep_parked)
        return 0
    if released:
        logger.info("released the parked state of %d run(s) and node groups older than %s", released,
                    dt.timedelta(seconds=policy.sweep.keep_parked))
    return released


def approver_store(agent: AuditStore) -> AuditStore:
    """Return the store an approval is written through: connection ``gpu_cost_db_approver`` (on PostgreSQL
    the role ``gpu_cost_approver``, the only one that may write approvals), else ``agent`` itself (SQLite)."""
    from gpu_cost.audit.connection import approver_url
    from gpu_cost.audit.store import AuditStore

    url = approver_url()
    return agent if url is None or url == agent.url else AuditStore(url).ensure_schema()


def mapped_values(values: Sequence[Any] | None) -> list[Any]:
    """Return the XCom values of a mapped task (a downstream task's argument ``task.expand(...)``) as a list.

    Airflow hands them over as a lazy sequence. Iterating it reads one value at a time until a read
    finds none, and the task supervisor logs that last read as an ERROR ("XCom not found ...
    offset=N"), every run, though nothing is wrong. A slice reads them all at once, in map index order.
    """
    return list(values[:]) if values is not None else []


#: the rule of the alert row a run records when a task's XCom input disagrees with the audit store
TAMPERING_RULE = "xcom_tampering"


def record_tampering(store: AuditStore, run_id: str, *, task: str, problems: list[str], now: float) -> str:
    """Record that ``task``'s XCom input disagrees with the audit store: one alert row in the run.

    Tasks carry out what the store holds, never what XCom says; this row says that someone changed
    XCom (Airflow's REST API lets anyone with XCom write access do it), and the run's ``finish``
    fails the run with these problems, so Airflow's failure alerting tells the operators. The row's
    id comes from the run and the task: a retried task records it once. Returns the id.
    """
    import hashlib

    from gpu_cost.core.model import Decision
    from gpu_cost.core.redact import redact_all

    problems = redact_all(problems)
    dag_id = run_id.split(":", 1)[0]
    did = hashlib.sha256(f"{TAMPERING_RULE}|{run_id}|{task}".encode()).hexdigest()[:20]
    d = Decision(decision_id=did, ts=now, rule=TAMPERING_RULE, target_kind="agent", target=f"agent:{dag_id}",
                 action="none", mode="notify", reason=f"XCom tampering before {task}: {'; '.join(problems)}"[:2000],
                 evidence={"task": task, "problems": list(problems)})
    store.record_decisions([d], run_id, status="recorded")
    logger.error("run %s: XCom tampering before %s, only what the audit store holds is used: %s", run_id, task,
                 "; ".join(problems))
    return did


def tampering_problems(store: AuditStore, run_id: str) -> list[str]:
    """Return the problems of the run's XCom tampering alerts (:func:`record_tampering`), oldest first."""
    import json

    out: list[str] = []
    for row in store.decisions_of_run(run_id):
        if row["rule"] != TAMPERING_RULE:
            continue
        ev = row.get("evidence")
        ev = json.loads(ev) if isinstance(ev, str) and ev else (ev or {})
        out += [f"XCom tampering before {ev.get('task')}: {p}" for p in ev.get("problems") or []]
    return out
