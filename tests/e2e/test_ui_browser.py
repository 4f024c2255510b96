"""The operator's path through the real Airflow UI, in headless Chromium.

Against a live api-server + scheduler + dag-processor (``airflow_server`` fixture): log in, open
``gpu_manual_reclaim``, fill the trigger form, trigger, wait for the run to succeed and check the
audit rows; then trigger an override that needs a second person, follow the approval link the
Slack notice carries to the Required Actions page, approve it there, and check that the owner was
notified and the approval recorded. Screenshots go to ``test-artifacts/``.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.core import need

pytestmark = [pytest.mark.browser, pytest.mark.e2e, pytest.mark.timeout(300)]

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
DAG_ID = "gpu_manual_reclaim"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    need(CHROMIUM)
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        yield b
        b.close()


def _login(browser: Any, server: Any, user: str) -> tuple[Any, Any]:
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
    p = ctx.new_page()
    p.set_default_timeout(30_000)
    p.goto(server.url + "/")
    p.locator("input[name=username]").fill(user)
    p.locator("input[name=password]").fill(server.password_of(user))
    p.get_by_role("button", name="Sign in").click()
    p.wait_for_url(server.url + "/")
    return ctx, p


@pytest.fixture(scope="module")
def page(browser, airflow_server) -> Iterator[Any]:  # type: ignore[no-untyped-def]
    """A page logged in as ``admin``, the operator who asks (SimpleAuthManager login form)."""
    ctx, p = _login(browser, airflow_server, "admin")
    yield p
    ctx.close()


@pytest.fixture(scope="module")
def approver_page(browser, airflow_server) -> Iterator[Any]:  # type: ignore[no-untyped-def]
    """A page logged in as ``lead``: the second person the policy names to approve overrides."""
    ctx, p = _login(browser, airflow_server, "lead")
    yield p
    ctx.close()


def _shot(page: Any, artifacts: Path, name: str) -> None:
    page.screenshot(path=str(artifacts / f"ui-{name}.png"), full_page=True)


def _trigger_from_form(page: Any, server: Any, artifacts: Path, name: str, *, ids: str, reason: str,
                       dry_run: bool = True, override: str | None = None) -> str:
    """Fill and submit the trigger form; return the new run's id (from the page it lands on)."""
    page.goto(f"{server.url}/dags/{DAG_ID}")
    page.get_by_role("button", name="Trigger Dag").click()
    form = page.get_by_role("dialog")
    form.locator("#element_target_ids").fill(ids)
    form.locator("#element_reason").fill(reason)
    if not dry_run:
        form.locator("label:has(input[name=element_dry_run])").click()
    if override:
        form.locator("label:has(input[name=element_override_protections])").click()
        form.locator("#element_override_justification").fill(override)
    assert form.locator("input[name=element_dry_run]").is_checked() is dry_run
    _shot(page, artifacts, f"{name}-form")
    form.get_by_role("button", name="Trigger", exact=True).click()
    page.wait_for_url(re.compile(rf"/dags/{DAG_ID}/runs/.+"))
    run_id = page.url.split(f"/dags/{DAG_ID}/runs/", 1)[1].split("/", 1)[0].split("?", 1)[0]
    from urllib.parse import unquote

    return unquote(run_id)


def _wait_run(server: Any, run_id: str, state: str = "success") -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        run = server.dag_run(DAG_ID, run_id)
        if run["state"] == "failed":
            pytest.fail(f"run {run_id} failed\n{server.logs_tail()}")
        return run if run["state"] == state else None

    return server.wait_for(done, f"run {run_id} to be {state}", timeout=150)  # type: ignore[no-any-return]


def _store(server: Any) -> Any:
    from gpu_cost.audit.store import AuditStore

    return AuditStore(server.audit_url)


def test_trigger_form_runs_a_dry_run_and_writes_the_audit_row(page, airflow_server, artifacts, slack_sink) -> None:  # type: ignore[no-untyped-def]
    run_id = _trigger_from_form(page, airflow_server, artifacts, "dry-run", ids="1003",
                                reason="idle for hours, freeing GPUs")
    _wait_run(airflow_server, run_id)
    page.reload()
    page.get_by_text("Success").first.wait_for()
    _shot(page, artifacts, "dry-run-success")
    store = _store(airflow_server)
    (row,) = store.decisions_of_run(f"{DAG_ID}:{run_id}")
    assert (row["rule"], row["target"], row["action"], row["mode"]) == ("manual", "job:1003", "notify", "dry-run")
    assert json.loads(row["evidence"])["requested_by"] == "admin"  # the UI user, recorded
    assert row["status"] == "recorded" and store.actions_of_decision(row["decision_id"]) == []  # as the sweep's dry run
    assert slack_sink.requests == []  # dry-run sent nothing


def test_override_is_approved_on_the_required_actions_page(page, approver_page, airflow_server, artifacts,  # type: ignore[no-untyped-def]
                                                           slack_sink) -> None:
    run_id = _trigger_from_form(page, airflow_server, artifacts, "override", ids="1007", dry_run=False,
                                reason="owner unreachable for days",
                                override="approved by the research lead in ticket 42")
    airflow_server.wait_for(lambda: airflow_server.task_state(DAG_ID, run_id, "approve") == "awaiting_input",
                            "the approval request", timeout=150)
    # the approver follows the link of the Slack announcement
    notice = airflow_server.wait_for(lambda: [t for t in slack_sink.texts() if t.startswith("Approval needed")],
                                     "the approval notice on Slack", timeout=30)[0]
    link = html.unescape(re.search(r"<(http[^|>]+)\|", notice).group(1))  # type: ignore[union-attr]
    assert link.startswith(f"{airflow_server.url}/dags/{DAG_ID}/runs/") and "/tasks/approve/required_actions" in link
    # the second person, not the requester, answers
    approver_page.goto(link)
    approver_page.get_by_text("OVERRIDDEN").first.wait_for()
    _shot(approver_page, artifacts, "override-required-action")
    approve = approver_page.get_by_role("button", name="Approve", exact=True)
    approve.click()

    def again() -> None:  # the retried task asked anew: the approver answers the new request on its page
        approver_page.goto(link)
        approve.click()

    assert airflow_server.wait_answering_again(DAG_ID, run_id, again, f"run {run_id} to end") == "success", \
        airflow_server.logs_tail()
    page.goto(f"{airflow_server.url}/dags/{DAG_ID}/runs/{run_id}")
    page.get_by_text("Success").first.wait_for()
    _shot(page, artifacts, "override-success")
    (row,) = _store(airflow_server).decisions_of_run(f"{DAG_ID}:{run_id}")
    assert row["approval_status"] == "approved" and row["approved_by"] == "lead"
    assert json.loads(row["evidence"])["requested_by"] == "admin" and json.loads(row["evidence"])["approvers"] == ["lead"]
    assert json.loads(row["evidence"])["override"]["justification"] == "approved by the research lead in ticket 42"
    actions = _store(airflow_server).actions_of_decision(row["decision_id"])
    assert len(actions) == 1, (row, airflow_server.task_state(DAG_ID, run_id, "act_approved"))
    (action,) = actions
    assert action["status"] == "succeeded" and action["dry_run"] == 0
    notices = [t for t in slack_sink.texts() if "owner unreachable for days" in t and not t.startswith("Approval")]
    assert len(notices) == 1 and "job:1007" in notices[0]
    assert "UISECRET" not in json.dumps(action)
