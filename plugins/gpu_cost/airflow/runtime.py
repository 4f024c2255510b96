"""What every DAG task needs: the policy, the audit store and the data instant of the run."""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpu_cost import paths
from gpu_cost.errors import PolicyError
from gpu_cost.timeutil import epoch

if TYPE_CHECKING:  # the store (SQLAlchemy) and the policy schema are imported where used: DAG files import
    # this module at parse time, and the DAG processor parses every file every few minutes
    from gpu_cost.audit.store import AuditStore
    from gpu_cost.policy.schema import Policy

logger = logging.getLogger(__name__)


def schedule(var: str, default: str) -> str | None:
    """Return a DAG's cron schedule: ``default`` unless the environment variable ``var`` overrides it.

    ``none`` (or an empty value) leaves only manual triggers: test clusters and staging use it so
    that no scheduled run appears beside the runs they trigger. Read at parse time: no I/O.
    """
    chosen = os.environ.get(var, default).strip()
    return None if chosen.lower() in ("", "none") else chosen


#: a policy's name: a file of the policy directory, never a path
POLICY_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
POLICY_SUFFIXES = (".yaml", ".yml")


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
    try:
        return sorted({p.stem for p in policy_dir().iterdir() if p.suffix in POLICY_SUFFIXES and p.is_file()})
    except OSError:
        return []


def policy_param() -> Any:
    """Return the DAG param that names a run's policy: a name from the policy directory, never a path.

    The form offers the directory's policies (read when the DAG file is parsed: a local listing,
    no connection); the name is checked again when the run starts (:func:`resolve_policy`).
    """
    from airflow.sdk import Param

    return Param(None, type=["null", "string"], pattern=POLICY_NAME.pattern, examples=policy_names() or None,
                 title="Policy",
                 description="A policy of the deployment's policy directory (GPU_COST_POLICY_DIR), by name; "
                             "empty: the deployment's default (GPU_COST_POLICY). The run pins it when it starts.")


def resolve_policy(name: str | None) -> Path:
    """Return the file of the policy ``name`` (None: the deployment's default, ``GPU_COST_POLICY``).

    A run names a policy of the policy directory; a path, or a name the directory does not hold,
    is refused: the form must not be able to lower the bar by pointing at another file.
    """
    if not name:
        return paths.default_policy()
    text = str(name)
    folder = policy_dir()
    stem = text[: -len(next(s for s in POLICY_SUFFIXES if text.endswith(s)))] if text.endswith(POLICY_SUFFIXES) else text
    if POLICY_NAME.match(stem) and ".." not in stem:
        for suffix in POLICY_SUFFIXES:
            candidate = folder / f"{stem}{suffix}"
            if candidate.is_file() and candidate.resolve().parent == folder.resolve():
                return candidate
    offered = ", ".join(policy_names()) or "none"
    raise PolicyError(text, "policy", f"not a policy of the deployment's policy directory {folder} "
                                      f"(a run names a policy, never a path; available: {offered})")


def policy_from(params: Mapping[str, Any] | None = None) -> Policy:
    """Load the policy named by the run's ``policy`` param, else ``GPU_COST_POLICY`` or the default."""
    from gpu_cost.policy import load_policy

    return load_policy(resolve_policy((params or {}).get("policy")))


def pin_policy(store: AuditStore, run_id: str, params: Mapping[str, Any] | None = None) -> Policy:
    """Pin the run's policy in the audit store (content and hash) and return it.

    The first task of a run calls this; every later task, and an approval answered later, reads
    the same content back with :func:`run_policy`, so an edit of the file mid-run changes nothing.
    Pinning again (a retried task) returns what was pinned first.
    """
    from gpu_cost.policy.loader import parse_policy

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
    from gpu_cost.policy.loader import parse_policy

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


def source_from(policy: Policy, params: Mapping[str, Any] | None = None) -> str:
    """Return the source: the run's ``source`` param, ``GPU_COST_SOURCE``, or the policy's."""
    chosen = (params or {}).get("source") or os.environ.get("GPU_COST_SOURCE") or policy.sweep.source
    return str(chosen)


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
