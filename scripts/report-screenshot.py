#!/usr/bin/env python3
"""Render the demo's weekly report as one full-page PNG: docs/sample-weekly-report.png.

    make report-picture                        # make demo, then this script
    .venv/bin/python scripts/report-screenshot.py [--report HTML] [--out PNG] [--width 1280] [--chromium PATH]

The report is the newest ``.demo/reports/*/index.html`` (``make demo`` writes it) unless
``--report`` names one. It is opened in headless Chromium through Playwright and captured with
``page.screenshot(full_page=True)``: the whole page, however long, not one screen. Chromium is
the system's (``/usr/bin/chromium``, installed by ``make system-deps``) when there is one, else
Playwright's own (``.venv/bin/playwright install chromium``); ``--chromium`` picks another.

The same report's headline figures go into the PNG (a text chunk, ``gpu-cost-figures``) and into
the sample table of ``docs/operator-guide.md`` (between its ``sample-table`` markers), so the picture
and the table beside it always show the same report (``tests/unit/test_docs.py`` checks it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "docs" / "sample-weekly-report.png"
GUIDE = ROOT / "docs" / "operator-guide.md"
TABLE_START = "<!-- sample-table: written by scripts/report-screenshot.py from the report in the picture below -->"
TABLE_END = "<!-- /sample-table -->"
SYSTEM_CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]


def newest_report(demo: Path) -> Path:
    """Return the newest ``index.html`` under ``demo/reports/``; exit with a hint when there is none."""
    found = sorted((demo / "reports").glob("*/index.html"), key=lambda p: p.stat().st_mtime)
    if not found:
        sys.exit(f"report-screenshot: no {demo / 'reports'}/*/index.html: run `make demo` first")
    return found[-1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Render the demo's weekly report as one full-page PNG.")
    ap.add_argument("--report", type=Path, help="the report's index.html (default: the newest under .demo/reports/)")
    ap.add_argument("--demo", type=Path, default=Path(".demo"), help="the demo's folder (default .demo)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the PNG to write (default docs/sample-weekly-report.png)")
    ap.add_argument("--width", type=int, default=1280, help="viewport width in CSS pixels (default 1280)")
    ap.add_argument("--chromium", type=Path, default=None,
                    help="Chromium to use (default: /usr/bin/chromium when present, else Playwright's own)")
    args = ap.parse_args(argv)

    report = (args.report or newest_report(args.demo)).resolve()
    if not report.is_file():
        sys.exit(f"report-screenshot: {report} does not exist")
    chromium = args.chromium or (SYSTEM_CHROMIUM if SYSTEM_CHROMIUM.exists() else None)
    from playwright.sync_api import sync_playwright

    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_name(f".{args.out.name}.{os.getpid()}.png")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(headless=True, args=ARGS,
                                     executable_path=str(chromium) if chromium else None)
        try:
            page = browser.new_page(viewport={"width": args.width, "height": 900}, device_scale_factor=1)
            page.goto(report.as_uri(), wait_until="load")
            page.screenshot(path=str(tmp), full_page=True)
        finally:
            browser.close()
    headline = _headline(report)
    _embed(tmp, headline)
    tmp.replace(args.out)
    size = args.out.stat().st_size
    print(f"wrote {args.out} ({size:,} bytes) from {report}")
    if args.out.resolve() == DEFAULT_OUT.resolve():
        _write_table(headline)
        print(f"wrote the sample table of {GUIDE}")
    return 0


def _headline(report: Path) -> dict:
    """Return the headline figures of the report (its ``kpis.json``), as the demo and the CLI print them."""
    from gpu_cost.report.render import headline

    return headline(json.loads((report.parent / "kpis.json").read_text(encoding="utf-8")))


def _embed(png: Path, figures: dict) -> None:
    """Keep ``figures`` in the PNG's text chunk (the docs test reads them back)."""
    from PIL import Image, PngImagePlugin

    from gpu_cost.report.render import FIGURES_CHUNK

    info = PngImagePlugin.PngInfo()
    info.add_text(FIGURES_CHUNK, json.dumps(figures, sort_keys=True))
    with Image.open(png) as img:
        img.load()
        img.save(png, pnginfo=info)


def _write_table(figures: dict) -> None:
    """Replace the operator guide's sample table with the one of ``figures``."""
    from gpu_cost.report.render import sample_table

    text = GUIDE.read_text(encoding="utf-8")
    head, sep, rest = text.partition(TABLE_START + "\n")
    _, sep2, tail = rest.partition(TABLE_END)
    if not sep or not sep2:
        sys.exit(f"report-screenshot: {GUIDE} has no {TABLE_START!r} ... {TABLE_END!r} markers")
    GUIDE.write_text(head + TABLE_START + "\n" + sample_table(figures) + TABLE_END + tail, encoding="utf-8")


if __name__ == "__main__":
    raise SystemExit(main())
