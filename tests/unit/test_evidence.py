"""Evidence beyond utilisation: what a job's log tail says, how it is cut, and the confidence of a finding."""

from __future__ import annotations

import numpy as np
import pytest

from gpu_cost.analyse import evidence
from gpu_cost.analyse.rules import run_rules
from gpu_cost.analyse.rules.common import interactive_session
from gpu_cost.config.loader import parse_policy
from gpu_cost.config.schema import JobLogConfig, Policy
from gpu_cost.core.errors import PolicyError
from gpu_cost.core.model import Job, Node, Snapshot
from gpu_cost.perceive import live
from gpu_cost.perceive.snapshot import from_matrix
from tests.fixtures.core import NOW

CFG = JobLogConfig()
WINDOW = 900.0
MIN_CONFIDENCE = Policy().evidence.min_confidence


def log(text: str, ago: float | None = 3600.0, **kw: object) -> dict:
    out: dict = {"text": text, "size": len(text), "path": "/home/u/slurm-1.out"}
    if ago is not None:
        out["mtime"] = NOW - ago
    out.update(kw)
    return out


def classify(entry: dict | None, cfg: JobLogConfig = CFG, window: float = WINDOW) -> dict:
    return evidence.classify_log(entry, cfg, NOW, window)


# -- classify_log ---------------------------------------------------------------------------------


@pytest.mark.parametrize("line,state", [
    ("Training finished after 30 epochs", "finished"),
    ("training is complete", "finished"),
    ("INFO: finished training, exiting", "finished"),
    ("saved final checkpoint to /ckpt/final.pt", "finished"),
    ("Evaluation completed: acc=0.91", "finished"),
    ("All done!", "finished"),
    ("Traceback (most recent call last):", "crashed"),
    ("torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", "crashed"),
    ("[rank0]: NCCL watchdog thread terminated with exception: Timeout", "crashed"),
    ("Segmentation fault (core dumped)", "crashed"),
    ("Overwrite the existing run directory? [y/N]", "waiting"),
    ("Press Enter to continue...", "waiting"),
    ("waiting for user input", "waiting"),
    ("Password:", "waiting"),
])
def test_default_patterns_recognise_the_state(line: str, state: str) -> None:
    out = classify(log(f"step 1 loss 2.3\nstep 2 loss 2.1\n{line}\n"))
    assert out["state"] == state and out["line"] == line and out["read"] is True
    assert out["pattern"] in getattr(CFG, state)


@pytest.mark.parametrize("text", ["step 100 loss 0.31\nstep 200 loss 0.29\n", "Epoch 3/10: val_acc=0.71\n",
                                  "the error rate is down; training continues\n", ""])
def test_ordinary_progress_lines_have_no_state(text: str) -> None:
    out = classify(log(text))
    assert out["state"] is None and out["line"] is None and out["read"] is True


def test_traceback_must_start_a_line() -> None:
    assert classify(log("logged: no Traceback (most recent call last) here\n"))["state"] is None


def test_the_last_matching_line_wins() -> None:
    text = ("step 10 loss 1.0\nTraceback (most recent call last):\n  File \"train.py\", line 3\n"
            "RuntimeError: CUDA out of memory\nrestarting from checkpoint 9\nstep 11 loss 0.9\n"
            "Training finished in 3h\n")
    out = classify(log(text))
    assert out["state"] == "finished" and out["line"] == "Training finished in 3h"
    # and the other way round: a finish, then a crash
    text = "Training finished\nsaving logs\nSegmentation fault (core dumped)\n"
    out = classify(log(text))
    assert out["state"] == "crashed" and out["line"] == "Segmentation fault (core dumped)"


def test_the_last_match_wins_across_patterns_of_one_state() -> None:
    text = "Traceback (most recent call last):\n  ...\ntorch.OutOfMemoryError: CUDA out of memory\n"
    out = classify(log(text))
    assert out["state"] == "crashed" and out["line"] == "torch.OutOfMemoryError: CUDA out of memory"


def test_ordinary_lines_after_a_verdict_mean_the_job_went_on() -> None:
    text = "Traceback (most recent call last):\nRuntimeError: CUDA out of memory\nrestarting from checkpoint 9\nstep 10\n"
    out = classify(log(text))
    assert out["state"] is None and out["earlier_state"] == "crashed"
    out = classify(log("Training finished\nstarting the next stage\nstep 1 loss 3.0\n"))
    assert out["state"] is None and out["earlier_state"] == "finished"


def test_one_line_after_a_verdict_keeps_it() -> None:
    out = classify(log("Training finished\nsaving logs\n"))
    assert out["state"] == "finished" and "earlier_state" not in out


def test_traceback_frames_and_blank_lines_after_a_crash_keep_it() -> None:
    text = ("Traceback (most recent call last):\n  File \"train.py\", line 3, in <module>\n    main()\n"
            "ValueError: bad shape\n\nDuring handling of the above exception, another exception occurred:\n\n"
            "Traceback (most recent call last):\n  File \"train.py\", line 5\nRuntimeError: giving up\n\n")
    out = classify(log(text))
    assert out["state"] == "crashed" and "earlier_state" not in out


@pytest.mark.parametrize("text,state", [
    pytest.param("step 10\nTraceback (most recent call last):\n  File \"train.py\", line 3, in <module>\n    main()\n"
                 "ValueError: bad shape\nsrun: error: gpu01: task 0: Exited with exit code 1\n"
                 "srun: Terminating StepId=123.0\n", "crashed", id="srun-epilogue"),
    pytest.param("Traceback (most recent call last):\n  File \"t.py\", line 9\n"
                 "RuntimeError: CUDA error: an illegal memory access was encountered\n"
                 "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace "
                 "below might be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1.\n", "crashed",
                 id="torch-cuda-hint"),
    pytest.param("epoch 30\nTraining finished\nwandb: Waiting for W&B process to finish... (success).\n"
                 "wandb: Synced run-abc: https://wandb.ai/x/y/runs/abc\n", "finished", id="wandb-epilogue"),
])
def test_closing_lines_of_the_launcher_keep_the_verdict(text: str, state: str) -> None:
    assert classify(log(text))["state"] == state


@pytest.mark.parametrize("ago,growing", [(0.0, True), (60.0, True), (WINDOW, True), (WINDOW + 1, False),
                                         (6 * 3600.0, False)])
def test_growing_only_when_written_within_the_window(ago: float, growing: bool) -> None:
    out = classify(log("step 1\n", ago=ago))
    assert out["growing"] is growing and out["written_s_ago"] == round(ago)


def test_the_window_is_the_callers() -> None:
    assert classify(log("step 1\n", ago=1800.0), window=7200.0)["growing"] is True
    assert classify(log("step 1\n", ago=1800.0), window=900.0)["growing"] is False


def test_no_mtime_is_not_growing() -> None:
    out = classify(log("step 1\n", ago=None))
    assert out["growing"] is False and out["written_s_ago"] is None and out["read"] is True


def test_a_future_mtime_counts_as_just_written() -> None:
    out = classify(log("step 1\n", ago=-120.0))  # the node's clock is ahead
    assert out["written_s_ago"] == 0 and out["growing"] is True


@pytest.mark.parametrize("entry", [None, {}])
def test_no_log_is_not_read(entry: dict | None) -> None:
    out = classify(entry)
    assert out["read"] is False and out["state"] is None and out["growing"] is False


def test_an_error_entry_is_not_read() -> None:
    out = classify(log("Training finished\n", ago=10.0, error="permission denied: /home/u/slurm-1.out"))
    assert out["read"] is False and out["error"] == "permission denied: /home/u/slurm-1.out"
    assert out["state"] is None and out["growing"] is False  # nothing of the text is believed


def test_patterns_come_from_the_policy() -> None:
    p = parse_policy("evidence:\n  job_log:\n    finished: ['^RUN COMPLETE$']\n", "<test>")
    cfg = p.evidence.job_log
    assert classify(log("x\nRUN COMPLETE\n"), cfg)["state"] == "finished"
    assert classify(log("Training finished\n"), cfg)["state"] is None  # the default is replaced
    assert classify(log("run complete\n"), cfg)["state"] == "finished"  # case-insensitive
    assert classify(log("CUDA out of memory\n"), cfg)["state"] == "crashed"  # other lists keep their defaults


def test_a_tail_read_before_is_judged_again_by_another_policys_patterns() -> None:
    """A tail's verdict is kept once read (several rules ask about the same job in a sweep, and a tail
    changes only when new lines arrive), but never across policies: the patterns decide with the text."""
    text = "epoch 9 loss 0.1\nRUN COMPLETE\n"
    ours = parse_policy("evidence:\n  job_log:\n    finished: ['^RUN COMPLETE$']\n", "<test>").evidence.job_log
    theirs = parse_policy("evidence:\n  job_log:\n    finished: ['^epoch \\d+']\n", "<test>").evidence.job_log
    for _ in range(2):  # the second time from what was kept
        assert classify(log(text), ours)["state"] == "finished" and classify(log(text), ours)["line"] == "RUN COMPLETE"
        assert classify(log(text))["state"] is None  # the defaults know no such line
        went_on = classify(log(text), theirs)  # the matched line is followed by one ordinary line only
        assert went_on["state"] == "finished" and went_on["line"] == "epoch 9 loss 0.1"
        assert classify(log(text + "epoch 10 loss 0.1\nepoch 11\n"), ours).get("earlier_state") == "finished"


@pytest.mark.parametrize("key,index", [("finished", 0), ("crashed", 1), ("waiting", 0)])
def test_a_bad_regex_is_a_policy_error_naming_its_key(key: str, index: int) -> None:
    items = ["'(unclosed'"] if index == 0 else ["'fine'", "'[bad'"]
    text = f"evidence:\n  job_log:\n    {key}: [{', '.join(items)}]\n"
    with pytest.raises(PolicyError) as exc:
        parse_policy(text, "<test>")
    assert f"evidence.job_log.{key}[{index}]" in str(exc.value)
    assert "regular expression" in str(exc.value) and str(exc.value).startswith("<test>")


def test_job_log_limits_are_checked() -> None:
    with pytest.raises(PolicyError, match=r"evidence\.job_log\.max_bytes"):
        parse_policy("evidence:\n  job_log:\n    max_bytes: 10\n", "<test>")
    with pytest.raises(PolicyError, match=r"evidence\.min_confidence"):
        parse_policy("evidence:\n  min_confidence: 1.5\n", "<test>")


# -- tail_lines -----------------------------------------------------------------------------------


def test_tail_keeps_the_newest_lines_within_max_bytes() -> None:
    lines = [f"line {i:03d}" for i in range(100)]  # 8 bytes + newline each
    out = evidence.tail_lines(lines, 9 * 5)
    assert out == "\n".join(lines[-5:])
    assert len(out.encode()) <= 45


def test_tail_drops_a_line_that_does_not_fit_whole() -> None:
    out = evidence.tail_lines(["old", "x" * 20, "new"], 10)
    assert out == "new"  # the 20-byte line does not fit: it and everything older are left out


def test_tail_counts_utf8_bytes() -> None:
    lines = ["a", "日本語", "🚀🚀"]  # 1, 9, 8 bytes (+1 each)
    assert evidence.tail_lines(lines, 9) == "🚀🚀"
    assert evidence.tail_lines(lines, 19) == "日本語\n🚀🚀"
    assert evidence.tail_lines(lines, 21) == "a\n日本語\n🚀🚀"


def test_tail_of_everything_that_fits() -> None:
    assert evidence.tail_lines(iter(["a", "b"]), 1000) == "a\nb"
    assert evidence.tail_lines([], 1000) == ""


# -- confidence -----------------------------------------------------------------------------------


BASE, _ = evidence.confidence({}, None)


def test_utilisation_alone_is_the_base() -> None:
    c, why = evidence.confidence({}, None)
    assert c == evidence.BASE_CONFIDENCE and c >= MIN_CONFIDENCE and len(why) == 1


@pytest.mark.parametrize("state", ["finished", "crashed"])
def test_a_log_that_says_the_work_is_over_raises_it(state: str) -> None:
    c, why = evidence.confidence(classify(log(f"{'Training finished' if state == 'finished' else 'core dumped'}\n")),
                                 None)
    assert c > BASE and any(state in w for w in why)


def test_a_quiet_log_raises_it_a_little_and_a_growing_one_does_not() -> None:
    quiet, _ = evidence.confidence(classify(log("step 1\n", ago=3600.0)), None)
    growing, _ = evidence.confidence(classify(log("step 1\n", ago=10.0)), None)
    finished, _ = evidence.confidence(classify(log("Training finished\n", ago=3600.0)), None)
    assert BASE < quiet < finished and growing == BASE


def test_resident_memory_alone_falls_below_min_confidence() -> None:
    c, why = evidence.confidence({}, None, resident=True)
    assert c < BASE and c < MIN_CONFIDENCE
    assert any("memory resident" in w for w in why)


def test_a_finished_log_outweighs_resident_memory() -> None:
    c, _ = evidence.confidence(classify(log("Training finished\n")), None, resident=True)
    assert c >= MIN_CONFIDENCE


def test_empty_memory_raises_it() -> None:
    c, why = evidence.confidence({}, None, resident=False)
    assert c > BASE and any("nothing in GPU memory" in w for w in why)
    assert evidence.confidence({}, None, resident=None)[0] == BASE  # unknown memory: no change


def test_a_quiet_log_says_nothing_of_gpus_that_hold_memory_or_were_not_measured() -> None:
    """A model loaded and waiting for requests writes nothing: a quiet log raises the confidence only of empty GPUs.
    Memory not measured (a trace of utilisation alone) counts as memory held: nothing says the GPUs are empty.
    (Before, resident memory and a quiet log made exactly min_confidence, and a generated service fleet's idle
    endpoints were terminated once someone approved: 1 false kill of 2 on the hard golden day, 4 of 6 with the
    class baselines off.)"""
    quiet = classify(log("step 1\n", ago=3600.0))
    assert evidence.confidence(quiet, None, resident=False)[0] > evidence.confidence({}, None, resident=False)[0]
    for kw in ({"resident": True}, {"resident": None, "measured": False}):
        c, why = evidence.confidence(quiet, None, **kw)  # type: ignore[arg-type]
        assert c == evidence.confidence({}, None, **kw)[0] < MIN_CONFIDENCE  # type: ignore[arg-type]
    c, why = evidence.confidence({}, None, measured=False)
    assert c < MIN_CONFIDENCE and any("GPU memory not measured" in w for w in why)
    finished = classify(log("Training finished\n", ago=3600.0))
    assert evidence.confidence(finished, None, measured=False)[0] >= MIN_CONFIDENCE  # the log still decides


def test_a_service_class_lowers_it() -> None:
    c, why = evidence.confidence({}, {"kind": "service", "members": 5})
    assert c < BASE and any("service" in w for w in why)
    assert evidence.confidence({}, {"kind": "training", "members": 5})[0] == BASE


def test_progress_and_bursts_lower_it() -> None:
    assert evidence.confidence({}, None, progress_signs=["its log was written 10 s ago"])[0] < BASE
    assert evidence.confidence({}, None, bursts=3)[0] < BASE
    assert evidence.confidence({}, None, bursts=0)[0] == BASE


def test_confidence_stays_within_0_and_1() -> None:
    low, _ = evidence.confidence({}, {"kind": "service"}, bursts=5, progress_signs=["x"], resident=True)
    high, _ = evidence.confidence(classify(log("Training finished\n")), None, resident=False)
    assert low == 0.0 and high == 1.0


def test_signal_is_a_small_dict() -> None:
    assert evidence.signal("job log", "Training finished", "it says the job finished") == {
        "what": "job log", "value": "Training finished", "counted": "it says the job finished"}


# -- log_candidates -------------------------------------------------------------------------------


def _snapshot(policy: Policy, busy_until: float | None = None) -> Snapshot:
    """Four GPUs on g1: job 1 holds GPUs 0-1 (idle), job 2 GPU 2 (idle), job 3 GPU 3 (busy, or until ``busy_until``)."""
    times = np.arange(NOW - policy.sweep.lookback + 60, NOW + 1, 60.0)
    util = np.full((4, len(times)), 0.3)
    util[3] = np.where(times <= (NOW + 1 if busy_until is None else busy_until), 90.0, 0.3)
    jobs = tuple(Job(job_id=j, user="u", start_ts=NOW - 6 * 3600, gpu_alloc=(("g1", g),), nodes=("g1",))
                 for j, g in (("2", (2,)), ("1", (0, 1)), ("3", (3,))))
    return from_matrix(policy=policy, now=NOW, source="test", hosts=np.array(["g1"] * 4, dtype=object),
                       gpus=np.arange(4), uuids=np.array([f"GPU-{i}" for i in range(4)], dtype=object),
                       models=np.array(["a100"] * 4, dtype=object), mem_total=np.full(4, 81920.0), times=times,
                       util=util, mem=np.full(util.shape, 2000.0), power=None, job=np.full(util.shape, "", dtype=object),
                       jobs=jobs, processes=(), nodes=(Node("g1", state="mixed", gpus_total=4, gpus_alloc=4),))


def test_logs_are_read_for_idle_jobs_only_most_gpus_first() -> None:
    p = Policy()
    assert [j.job_id for j in live.log_candidates(_snapshot(p), p)] == ["1", "2"]


def test_logs_are_read_for_jobs_idle_over_the_idle_rules_own_window() -> None:
    """With the zombie window (the snapshot's primary one) at 30 minutes and the idle-allocation window at 15, job 3,
    busy until 20 minutes ago, is one the idle-allocation rule finds idle: its log is read, so a log still written
    is the progress that spares it. Read on the primary window, it was not."""
    p = parse_policy("rules: {zombie: {window: 30m}, idle_allocation: {window: 15m}}\n", "<test>")
    snap = _snapshot(p, busy_until=NOW - 20 * 60)
    assert [j.job_id for j in live.log_candidates(snap, p)] == ["1", "2", "3"]
    assert [f.job_id for f in run_rules(snap, p, names=["idle_allocation"])] == ["1", "2", "3"]


@pytest.mark.parametrize("seed", range(20))
def test_every_job_an_idle_rule_finds_had_its_node_checked_and_its_log_read(seed: int) -> None:
    """Over random fleets and random policies from the tune space's knobs (the zombie window, which is the snapshot's
    primary one; the idle-allocation window and threshold; the idle-interactive threshold): every job the idle rules
    find is one whose node the sweep inspected first (``idle_job_hosts``) and whose log it read (``log_candidates``)."""
    rng = np.random.default_rng(seed)
    zombie, window = rng.choice(["10m", "15m", "30m"]), rng.choice(["15m", "30m", "1h"])
    alloc, inter = int(rng.choice([2, 5, 8])), int(rng.choice([5, 10]))
    p = parse_policy(f"rules: {{zombie: {{window: {zombie}}}, idle_allocation: {{window: {window}, util_max: {alloc}}},\n"
                     f"        idle_interactive: {{util_max: {inter}}}}}\n"
                     "evidence: {job_log: {max_jobs_per_sweep: 1000}}\n", "<test>")
    times = np.arange(NOW - p.sweep.lookback + 60, NOW + 1, 60.0)
    n = 32
    # each GPU: busy until a random moment, then at a random low level (some under each threshold, some not)
    until = NOW - 60 * rng.choice([5, 12, 17, 20, 25, 28, 45, 70, 100, 150, 240], n) - rng.uniform(0, 120, n)
    low = rng.choice([0.3, 1.5, 3.0, 6.0, 9.0, 40.0], n)
    util = np.where(times[None, :] <= until[:, None], 90.0, low[:, None])
    hosts = np.array([f"g{i // 4}" for i in range(n)], dtype=object)
    idx = np.arange(n) % 4
    jobs = tuple(Job(job_id=str(k), user="u", start_ts=NOW - 6 * 3600, nodes=(f"g{k // 2}",),
                     gpu_alloc=((f"g{k // 2}", tuple(range(2 * (k % 2), 2 * (k % 2) + 2))),), batch=bool(rng.random() < 0.6))
                 for k in range(n // 2))
    snap = from_matrix(policy=p, now=NOW, source="test", hosts=hosts, gpus=idx,
                       uuids=np.array([f"GPU-{i}" for i in range(n)], dtype=object),
                       models=np.array(["a100"] * n, dtype=object), mem_total=np.full(n, 81920.0), times=times,
                       util=util, mem=np.full(util.shape, 2000.0), power=None,
                       job=np.full(util.shape, "", dtype=object), jobs=jobs, processes=(),
                       nodes=tuple(Node(f"g{h}", state="mixed", gpus_total=4, gpus_alloc=4) for h in range(n // 4)))
    found = run_rules(snap, p, names=["idle_allocation", "idle_interactive"])
    checked = set(live.idle_job_hosts(snap.gpus, jobs, p, snap.windows))
    read = {j.job_id for j in live.log_candidates(snap, p)}
    for f in found:
        assert set(f.nodes) <= checked, (f.rule, f.job_id, zombie, window, alloc, inter)
        assert f.job_id in read, (f.rule, f.job_id, zombie, window, alloc, inter)


def test_log_reading_is_capped_and_can_be_disabled() -> None:
    p = parse_policy("evidence: {job_log: {max_jobs_per_sweep: 1}}\n", "<test>")
    assert [j.job_id for j in live.log_candidates(_snapshot(p), p)] == ["1"]
    for text in ("evidence: {job_log: {max_jobs_per_sweep: 0}}\n", "evidence: {job_log: {enabled: false}}\n"):
        p = parse_policy(text, "<test>")
        assert live.log_candidates(_snapshot(p), p) == []


def test_a_manual_request_weighs_a_session_by_the_idle_interactive_rule() -> None:
    """What a manual cancel of a job is weighed by (``evidence.assess``): a session idle to the idle-interactive rule
    (7 % under its 10 % over two hours) gets the agent's doubts (its confidence) as a batch job idle to the
    idle-allocation rule does; read with the idle-allocation threshold (5 %) it counted as busy, no doubt to weigh."""
    p = parse_policy("rules: {idle_interactive: {util_max: 10}}\n", "<test>")
    times = np.arange(NOW - p.sweep.lookback + 60, NOW + 1, 60.0)
    util = np.full((1, len(times)), 7.0)

    def weighed(batch: bool) -> dict | None:
        job = Job(job_id="1", user="u", start_ts=NOW - 6 * 3600, gpu_alloc=(("g1", (0,)),), nodes=("g1",),
                  batch=batch)
        snap = from_matrix(policy=p, now=NOW, source="test", hosts=np.array(["g1"], dtype=object), gpus=np.arange(1),
                           uuids=np.array(["GPU-0"], dtype=object), models=np.array(["a100"], dtype=object),
                           mem_total=np.full(1, 81920.0), times=times, util=util, mem=np.full(util.shape, 2000.0),
                           power=None, job=np.full(util.shape, "", dtype=object), jobs=(job,), processes=(),
                           nodes=(Node("g1", state="mixed", gpus_total=1, gpus_alloc=1),))
        return evidence.assess(snap, job, p, session=bool(interactive_session(job, p.interactive)))

    session = weighed(batch=False)
    assert session is not None and 0 < session["confidence"] <= 1 and session["confidence_why"]
    assert weighed(batch=True) is None  # 7 % is busy to the idle-allocation rule's 5 %


def test_a_manual_cancel_of_a_session_carries_the_agents_doubts() -> None:
    """The manual reclaim asks the session's own rule: its decision carries the confidence a sweep would give."""
    from gpu_cost.loop import reclaim

    p = parse_policy("mode: enforce\nrules: {idle_interactive: {util_max: 10}}\n"
                     "manual: {operators: [ops]}\ncaps: {max_gpu_share: 1.0}\n", "<test>")
    times = np.arange(NOW - p.sweep.lookback + 60, NOW + 1, 60.0)
    util = np.full((1, len(times)), 7.0)
    job = Job(job_id="1", user="u", start_ts=NOW - 6 * 3600, gpu_alloc=(("g1", (0,)),), nodes=("g1",), batch=False)
    snap = from_matrix(policy=p, now=NOW, source="test", hosts=np.array(["g1"], dtype=object), gpus=np.arange(1),
                       uuids=np.array(["GPU-0"], dtype=object), models=np.array(["a100"], dtype=object),
                       mem_total=np.full(1, 81920.0), times=times, util=util, mem=np.full(util.shape, 2000.0),
                       power=None, job=np.full(util.shape, "", dtype=object), jobs=(job,), processes=(),
                       nodes=(Node("g1", state="mixed", gpus_total=1, gpus_alloc=1),))
    request = reclaim.parse_request({"target_kind": "job", "target_ids": ["1"], "action": "cancel",
                                     "reason": "session left open", "dry_run": False}, requested_by="ops")
    (d,) = reclaim.plan(request, p, snap, now=NOW, run_key="r").decisions
    assert 0 < d.evidence["confidence"] <= 1 and d.evidence["confidence_why"]


# -- files in the job's working directory ---------------------------------------------------------


def test_files_growing_from_the_working_directorys_newest_file() -> None:
    out = classify(log("step 1\n", workdir_mtime=NOW - 40.0, workdir_newest="checkpoints/step_5000.pt"))
    assert out["files_growing"] is True and out["files_written_s_ago"] == 40
    assert out["files_newest"] == "checkpoints/step_5000.pt"
    assert out["growing"] is False  # the log itself is an hour old
    out = classify(log("step 1\n", workdir_mtime=NOW - WINDOW - 1, workdir_newest="checkpoints/step_1.pt"))
    assert out["files_growing"] is False and out["files_written_s_ago"] == round(WINDOW + 1)


@pytest.mark.parametrize("value", [None, "soon", True, float("nan")])
def test_no_usable_workdir_mtime_is_not_growing(value: object) -> None:
    out = classify(log("step 1\n", workdir_mtime=value, workdir_newest="x"))
    assert out["files_growing"] is False and out["files_written_s_ago"] is None and out["files_newest"] is None


def test_files_growing_is_known_even_when_the_log_was_not_read() -> None:
    out = classify({"error": "gpu01: job 1's log not read: stdout /j/1.out: permission denied",
                    "workdir_mtime": NOW - 5.0, "workdir_newest": "out/part-0007.parquet"})
    assert out["read"] is False and out["files_growing"] is True and out["files_written_s_ago"] == 5


def _progress(entry: dict) -> list[str]:
    p = Policy()
    snap = _snapshot(p)
    job = next(j for j in snap.jobs if j.job_id == "1")
    return evidence.progress(snap, job, [float("nan")], classify(entry), p)


def test_a_checkpoint_being_written_is_progress() -> None:
    signs = _progress(log("step 5000\n", workdir_mtime=NOW - 40.0, workdir_newest="checkpoints/step_5000.pt"))
    assert signs == ["a file in its working directory (checkpoints/step_5000.pt) was written 40 s ago"]
    assert evidence.confidence(classify(log("step 5000\n")), None, progress_signs=signs)[0] < MIN_CONFIDENCE


@pytest.mark.parametrize("text", ["Training finished\n", "Traceback (most recent call last):\n"])
def test_a_file_written_after_a_finish_or_a_crash_is_still_progress(text: str) -> None:
    signs = _progress(log(text, ago=30.0, workdir_mtime=NOW - 10.0, workdir_newest="checkpoints/final.pt"))
    assert signs == ["a file in its working directory (checkpoints/final.pt) was written 10 s ago"]


def test_a_stale_file_is_no_progress() -> None:
    assert _progress(log("step 5000\n", workdir_mtime=NOW - 3 * 3600.0, workdir_newest="checkpoints/step_1.pt")) == []
    assert _progress(log("step 5000\n", workdir_mtime=None, workdir_newest=None)) == []


# -- the job's own processes (the wrapper's one-second sample) -----------------------------------------


def test_the_processes_cpu_and_io_pass_through_even_when_the_log_was_not_read() -> None:
    out = classify(log("step 1\n", cpu_cores=1.25, io_bps=3 * 1048576.0))
    assert out["cpu_cores"] == 1.25 and out["io_bps"] == 3 * 1048576.0
    out = classify({"error": "gpu01: job 1's log not read: stdout /j/1.out: permission denied", "cpu_cores": 2,
                    "io_bps": None})
    assert out["read"] is False and out["cpu_cores"] == 2.0 and out["io_bps"] is None
    for value in (None, "busy", True, float("nan")):
        out = classify(log("step 1\n", cpu_cores=value, io_bps=value))
        assert out["cpu_cores"] is None and out["io_bps"] is None
    assert classify(None)["cpu_cores"] is None and classify(None)["io_bps"] is None


def test_busy_processes_of_the_job_are_progress_on_a_shared_node() -> None:
    # job 1 shares g1 with job 2: the node's CPU would not count, its own processes do
    assert _progress(log("step 1\n", cpu_cores=1.3, io_bps=0.0)) == ["its processes use 1.3 CPU cores"]
    assert _progress(log("step 1\n", cpu_cores=0.5)) == ["its processes use 0.5 CPU cores"]  # at the threshold
    assert _progress(log("step 1\n", cpu_cores=0.01, io_bps=80 * 1048576.0)) == [
        "its processes read and write 80 MiB/s"]
    assert _progress(log("step 1\n", cpu_cores=2.0, io_bps=50 * 1048576.0)) == [
        "its processes use 2.0 CPU cores", "its processes read and write 50 MiB/s"]


def test_quiet_or_unknown_processes_are_no_progress() -> None:
    assert _progress(log("step 1\n", cpu_cores=0.49, io_bps=49 * 1048576.0)) == []
    assert _progress(log("step 1\n", cpu_cores=0.0, io_bps=0.0)) == []
    assert _progress(log("step 1\n", cpu_cores=None, io_bps=None)) == []
    assert _progress(log("step 1\n")) == []  # an older wrapper: nothing sampled


def test_the_policy_sets_the_processes_thresholds() -> None:
    assert Policy().evidence.job_cpu_cores == 0.5
    p = parse_policy("evidence: {job_cpu_cores: 2, io_busy_mib_s: 200}\n", "<test>")
    assert p.evidence.job_cpu_cores == 2.0
    snap = _snapshot(p)
    job = next(j for j in snap.jobs if j.job_id == "1")

    def signs(**kw: object) -> list[str]:
        return evidence.progress(snap, job, [float("nan")], classify(log("step 1\n", **kw)), p)

    assert signs(cpu_cores=1.3, io_bps=80 * 1048576.0) == []
    assert signs(cpu_cores=2.5, io_bps=250 * 1048576.0) == ["its processes use 2.5 CPU cores",
                                                           "its processes read and write 250 MiB/s"]
    low = parse_policy("evidence: {job_cpu_cores: 0.1, io_busy_mib_s: 1}\n", "<test>")
    assert evidence.progress(snap, job, [float("nan")], classify(log("step 1\n", cpu_cores=0.2, io_bps=1.5 * 1048576)),
                             low) == ["its processes use 0.2 CPU cores", "its processes read and write 1.5 MiB/s"]
    with pytest.raises(PolicyError, match="job_cpu_cores"):
        parse_policy("evidence: {job_cpu_cores: -1}\n", "<test>")


# -- nodes a job has to itself ----------------------------------------------------------------------


def test_a_node_is_the_jobs_own_until_another_running_job_uses_it() -> None:
    import dataclasses

    from gpu_cost.core.model import empty_gpu_frame

    a = Job(job_id="a", user="u", start_ts=NOW - 3600, nodes=("n1", "n2"))
    b = Job(job_id="b", user="u", start_ts=NOW - 3600, gpu_alloc=(("n2", (0,)),))  # nodes from its GPUs
    done = Job(job_id="c", user="u", state="COMPLETED", start_ts=NOW - 7200, nodes=("n1",))
    nodes = (Node("n2", state="mixed"), Node("n3"), Node("n1", state="mixed"))
    snap = Snapshot(ts=NOW, window_s=900, lookback_s=3600, source="test", gpus=empty_gpu_frame(), jobs=(a, b, done),
                    nodes=nodes)
    assert evidence.nodes_to_itself(snap, a) == {"n1"}  # a finished job holds nothing
    assert evidence.nodes_to_itself(snap, b) == set()
    assert evidence.nodes_to_itself(snap, done) == set()  # not running itself: n1 is a's, not its own
    assert [n.name for n in snap.nodes_named({"n1", "n2", "n9"})] == ["n2", "n1"]  # the snapshot's order
    # the index follows the jobs: a snapshot with other jobs answers for those
    later = dataclasses.replace(snap, jobs=(a,))
    assert evidence.nodes_to_itself(later, a) == {"n1", "n2"}
    snap.jobs = (a, b, dataclasses.replace(done, state="RUNNING"))
    assert evidence.nodes_to_itself(snap, a) == set()
