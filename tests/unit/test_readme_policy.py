"""The policy page's annotated policy is the shipped policy file, byte for byte (a test fails when they drift).

The block lives in ``docs/policy.md`` between ``<!-- generated: shipped-policy -->`` and ``<!-- /generated -->``:
``gpu_cost.cli.docgen`` copies the file there, nobody pastes it.
"""

from __future__ import annotations

from tests.fixtures.core import ROOT

MARK = "The shipped policy, annotated:\n\n<!-- generated: shipped-policy -->\n\n```yaml\n"
PAGE = ROOT / "docs" / "policy.md"


def test_the_policy_page_shows_the_shipped_policy() -> None:
    page = PAGE.read_text(encoding="utf-8")
    assert MARK in page, f"{PAGE.relative_to(ROOT)} lost its block starting {MARK!r}"
    start = page.index(MARK) + len(MARK)
    shown = page[start:page.index("```", start)]
    assert shown == (ROOT / "include" / "policy" / "default.yaml").read_text(encoding="utf-8"), (
        "docs/policy.md's policy block differs from include/policy/default.yaml: regenerate it with "
        ".venv/bin/python -m gpu_cost.cli.docgen")
