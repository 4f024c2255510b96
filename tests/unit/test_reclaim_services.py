"""An operator's manual reclaim reads the same service verdict as the sweep.

The sweep advises a service and never kills it: declared in ``inference:``, bursty within the lookback,
recognised by its class baseline, or an idle replica of a set whose other members serve. A manual
cancel of such a job used to look only at the first and the third: a replica of a serving set, or a
bursty service its baseline had not learnt yet, was cancelled on an operator's word alone. Both ways
in now read :func:`gpu_cost.analyse.rules.common.service_verdict`, and a manual destructive action on
a service waits for a human's approval, naming why.
"""

from __future__ import annotations

import numpy as np
import pytest

from gpu_cost.analyse.rules.common import job_bursts
from gpu_cost.core.model import Decision, Snapshot
from gpu_cost.loop import reclaim
from tests.unit.policy.helpers import policy_from
from tests.unit.test_replicas import MODEL, NOW, QUIET, TIMES, fleet, idle_findings, pod, serving_set, trickle

#: enforce, an operator, a bar for the GPU-hours at risk and a GPU-share cap no request here reaches (the fleets are
#: a few GPUs): approval comes from the verdict
POLICY = policy_from("mode: enforce\napproval: {gpu_hours_at_risk: 100000}\ncaps: {max_gpu_share: 1.0}\n"
                     "manual: {operators: [ops, lead], override_approvers: [lead, ops]}\n")


def manual_cancel(snap: Snapshot, job_id: str) -> Decision:
    request = reclaim.parse_request({"target_kind": "job", "target_ids": [job_id], "action": "cancel",
                                     "reason": "freeing idle GPUs now", "dry_run": False}, requested_by="ops")
    (d,) = reclaim.plan(request, POLICY, snap, now=NOW, run_key="r").decisions
    return d


@pytest.mark.parametrize(("starved", "serving"), [(1, 1), (1, 3), (2, 2), (2, 4)])
def test_a_spare_replica_the_sweep_only_advises_needs_approval_to_be_cancelled_by_hand(starved: int, serving: int) -> None:
    snap = fleet(serving_set(starved=starved, serving=serving), POLICY)
    found = idle_findings(snap, POLICY)
    for i in range(starved):
        jid = str(100 + i)
        assert found[jid].inference and "replicas of" in found[jid].evidence["inference"]
        d = manual_cancel(snap, jid)
        assert d.requires_approval, d.reason
        assert found[jid].evidence["inference"] in d.reason


@pytest.mark.parametrize("every", [3, 7, 19])
def test_a_bursty_service_busy_now_needs_approval_to_be_cancelled_by_hand(every: int) -> None:
    # one replica alone (no set), serving a trickle: no class baseline yet, not declared, busy at times
    snap = fleet([(pod(0, "ranker"), trickle(every=every), MODEL)], POLICY)
    bursts = job_bursts(snap, "100")
    assert bursts >= POLICY.inference.min_bursts
    d = manual_cancel(snap, "100")
    assert d.requires_approval, d.reason
    assert f"{bursts} bursts of activity in the lookback" in d.reason


def test_a_job_that_is_no_service_is_cancelled_without_asking() -> None:
    # the control: a training job busy throughout, and an idle job with nothing on its GPU, nobody's replica
    busy = np.full(len(TIMES), 95.0)
    snap = fleet([(pod(0, "train-resnet"), busy, MODEL), (pod(1, "finetune"), QUIET, 0.0)], POLICY)
    assert job_bursts(snap, "100") == 0
    for jid in ("100", "101"):
        d = manual_cancel(snap, jid)
        assert not d.requires_approval, d.reason
        assert d.action == "cancel"
