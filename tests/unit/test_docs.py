"""The documentation cannot drift: the site builds strictly, the generated references match the code,
and the README points only at pages that exist.

- ``mkdocs build --strict`` succeeds (no broken link or anchor, every page in the nav);
- ``docs/reference/cli.md`` and ``docs/reference/policy.md`` equal what ``gpu_cost.cli.docgen`` generates
  now (regenerate with ``.venv/bin/python -m gpu_cost.cli.docgen``), whatever the terminal width or the
  working directory, and embed no absolute path;
- every key of the policy schema and every subcommand and option of ``gpu-cost`` is in them (walked
  here independently of ``gpu_cost.cli.docgen``);
- README.md is short, names the two commands, and links only to documentation pages that exist.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import subprocess
import sys
import typing
from pathlib import Path
from typing import Annotated, Any, get_args, get_origin

import pytest

from gpu_cost.cli import docgen
from gpu_cost.cli.main import build_parser
from gpu_cost.config.schema import Policy, Rules
from gpu_cost.config.typed import SPREAD
from gpu_cost.core import registry
from tests.fixtures.core import ROOT

README = ROOT / "README.md"
DOCS = ROOT / "docs"
REGENERATE = ".venv/bin/python -m gpu_cost.cli.docgen"


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    mkdocs = Path(sys.executable).with_name("mkdocs")
    assert mkdocs.exists(), f"{mkdocs} is missing: run `make setup` (requirements-dev.lock installs mkdocs)"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run([str(mkdocs), "build", "--strict", "-f", str(ROOT / "mkdocs.yml"), "-d", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}\n{proc.stderr}"
    for page in ("index.html", "reference/cli/index.html", "reference/policy/index.html", "policy/index.html"):
        assert (tmp_path / "site" / page).is_file(), page


def test_the_generated_references_match_the_code() -> None:
    stale = docgen.drifted()
    assert not stale, f"{', '.join(stale)} drifted from the code: regenerate with {REGENERATE}"


def test_the_generated_references_depend_on_neither_the_terminal_nor_the_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "37")
    pages = docgen.pages()
    for rel, text in pages.items():
        assert text == (ROOT / rel).read_text(encoding="utf-8"), f"{rel} changes with the terminal width or folder"
        for path in {str(ROOT), str(Path.home()), str(tmp_path)}:
            assert path not in text, f"{rel} embeds the absolute path {path}"
        assert text.startswith("<!-- Generated"), f"{rel} does not open with its 'generated' comment"
        assert REGENERATE in text.split("-->")[0]


def test_docgen_check_names_a_drifted_page(tmp_path: Path) -> None:
    for rel, text in docgen.generated().items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text, encoding="utf-8")
    assert docgen.drifted(tmp_path) == []
    (tmp_path / docgen.POLICY_PAGE).write_text("# edited by hand\n", encoding="utf-8")
    assert docgen.drifted(tmp_path) == [docgen.POLICY_PAGE]
    # a generated block edited by hand, or lost, is drift too; the text around a block is the page's own
    index = tmp_path / docgen.INDEX_PAGE
    text = index.read_text(encoding="utf-8")
    index.write_text(text.replace("| `zombie` |", "| `zombie (edited)` |"), encoding="utf-8")
    assert docgen.drifted(tmp_path) == [docgen.POLICY_PAGE, docgen.INDEX_PAGE]
    index.write_text(text.replace("## What it finds", "## What the agent finds"), encoding="utf-8")
    assert docgen.INDEX_PAGE not in docgen.drifted(tmp_path)
    index.write_text(text.replace("<!-- /generated -->", ""), encoding="utf-8")
    assert docgen.INDEX_PAGE in docgen.drifted(tmp_path)
    with pytest.raises(ValueError, match="lost its generated block"):
        docgen.generated(tmp_path)


def test_the_home_pages_rules_table_is_the_registry() -> None:
    """docs/index.md keeps no hand-written list of rules: its table is every registered rule, in order,
    with its default ladder from the rule module's settings (issue 35)."""
    page = (DOCS / "index.md").read_text(encoding="utf-8")
    block = page.split("<!-- generated: rules-table -->", 1)[1].split("<!-- /generated -->", 1)[0]
    rows = [line for line in block.splitlines() if line.startswith("| `")]
    assert [row.split("`")[1] for row in rows] == list(registry.rules())
    zombie = rows[0]
    assert "`notify`, then `kill_process` after 15m" in zombie
    assert page.count("| rule |") == 1, "docs/index.md has a rules table outside its generated block"


# -- independent walks of the schema and the parsers -----------------------------------------------
def _schema_paths(cls: type, prefix: str = "") -> list[str]:
    out = []
    if cls is Rules:  # one section per registered rule, declared by its module
        for name, spec in registry.rules().items():
            out.append(f"{prefix}.{name}")
            out += _schema_paths(spec.config, f"{prefix}.{name}")
        return out
    hints = typing.get_type_hints(cls, include_extras=True)
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        if f.metadata.get(SPREAD):  # the actions' sections, top-level keys declared by their executor modules
            for name, spec in registry.action_sections().items():
                assert spec.config is not None
                out.append(f"{prefix}.{name}" if prefix else name)
                out += _schema_paths(spec.config, f"{prefix}.{name}" if prefix else name)
            continue
        path = f"{prefix}.{f.name}" if prefix else f.name
        out.append(path)
        tp = hints[f.name]
        while get_origin(tp) is Annotated:
            tp = get_args(tp)[0]
        if dataclasses.is_dataclass(tp) or tp is Rules:
            out += _schema_paths(tp, path)  # type: ignore[arg-type]
        elif get_origin(tp) is tuple and dataclasses.is_dataclass(get_args(tp)[0]):
            out += _schema_paths(get_args(tp)[0], path + "[]")
        elif get_origin(tp) is dict and dataclasses.is_dataclass(get_args(tp)[1]):
            out += _schema_paths(get_args(tp)[1], path + ".<name>")
    return out


def test_every_policy_key_is_in_the_policy_reference() -> None:
    page = (ROOT / docgen.POLICY_PAGE).read_text(encoding="utf-8")
    paths = _schema_paths(Policy)
    assert len(paths) > 100 and "rules.idle_allocation.ladder[].after" in paths and "caps.rolling.max_actions_per_day" in paths
    assert "demote.nice" in paths and "actions" not in paths
    missing = [p for p in paths if f"| `{p}` |" not in page]
    assert not missing, f"policy keys missing from {docgen.POLICY_PAGE}: {missing}; regenerate with {REGENERATE}"


def _commands(parser: argparse.ArgumentParser, words: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out.append(((*words, name), sub))
                out += _commands(sub, (*words, name))
    return out


def _sections(page: str) -> dict[str, str]:
    """Return {command name: its part of the page} from the ``## `gpu-cost ...` `` headings."""
    parts = re.split(r"^#{2,4} `(gpu-cost[^`]*)`\n", page, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def test_every_subcommand_and_option_is_in_the_cli_reference() -> None:
    page = (ROOT / docgen.CLI_PAGE).read_text(encoding="utf-8")
    sections = _sections(page)
    cmds = _commands(build_parser())
    names = {" ".join(w) for w, _ in cmds}
    assert {"audit", "db current", "db upgrade", "demo", "report", "replay", "snooze", "sim-trace"} <= names
    missing = [n for n in sorted(names) if f"gpu-cost {n}" not in sections]
    assert not missing, f"subcommands missing from {docgen.CLI_PAGE}: {missing}; regenerate with {REGENERATE}"
    for words, sub in cmds:
        text = sections[" ".join(("gpu-cost", *words))]
        for action in sub._actions:
            if action.help is argparse.SUPPRESS or isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
                continue
            for flag in action.option_strings or [action.dest]:
                assert f"`{flag}`" in text, f"gpu-cost {' '.join(words)} {flag} is missing from {docgen.CLI_PAGE}"


# -- the README ------------------------------------------------------------------------------------
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def _slug(heading: str) -> str:
    """GitHub's and MkDocs' anchor of a heading (the two agree on plain headings)."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return re.sub(r"[ ]+", "-", text).strip("-")


def test_the_readme_is_short_and_links_only_to_pages_that_exist() -> None:
    readme = README.read_text(encoding="utf-8")
    assert len(readme.splitlines()) < 200, "README.md has grown past 200 lines: move the details into docs/"
    links = _LINK.findall(readme)
    assert any(t.startswith("docs/") and t.endswith(".md") for t in links), "README.md links to no documentation page"
    for target in links:
        if re.match(r"^[a-z]+://", target) or target.startswith("mailto:"):
            continue
        path, _, anchor = target.partition("#")
        assert path.startswith("docs/"), f"README.md links to {target!r}, outside docs/"
        file = ROOT / path
        assert file.is_file(), f"README.md links to {target!r}, which does not exist"
        if anchor:
            headings = re.findall(r"^#{1,6} (.+)$", file.read_text(encoding="utf-8"), flags=re.M)
            assert anchor in {_slug(h) for h in headings}, f"README.md links to {target!r}: no such heading"


def test_the_readme_names_the_two_commands() -> None:
    readme = README.read_text(encoding="utf-8")
    for command in ("make demo", "make test"):
        assert command in readme, f"README.md no longer names `{command}`"
    assert "docs/sample-weekly-report.png" in readme


def test_the_operator_guides_sample_table_shows_the_report_in_the_picture() -> None:
    """The sample table beside docs/sample-weekly-report.png shows that picture's report (issue 39 row 4):
    scripts/report-screenshot.py keeps the report's headline in the PNG and writes the table from it."""
    import json

    from PIL import Image

    from gpu_cost.report.render import FIGURES_CHUNK, sample_table

    with Image.open(DOCS / "sample-weekly-report.png") as img:
        chunk = img.info.get(FIGURES_CHUNK)
    assert chunk, "docs/sample-weekly-report.png has no figures: regenerate it with `make report-picture`"
    guide = (DOCS / "operator-guide.md").read_text(encoding="utf-8")
    table = guide.split("<!-- sample-table:", 1)[1].split("-->", 1)[1].split("<!-- /sample-table -->", 1)[0]
    assert table.strip() == sample_table(json.loads(chunk)).strip()
