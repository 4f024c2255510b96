#!/usr/bin/env python3
"""Render the demo's weekly report as one full-page PNG: docs/sample-weekly-report.png.

    make report-picture                        # make demo, then this script
    .venv/bin/python scripts/report-screenshot.py [--report HTML] [--out PNG] [--width 1280] [--chromium PATH]

The report is the newest ``.demo/reports/*/index.html`` (``make demo`` writes it) unless
``--report`` names one. It is opened in headless Chromium through Playwright and captured with
``page.screenshot(full_page=True)``: the whole page, however long, not one screen. Chromium is
the system's (``/usr/bin/chromium``, installed by ``make system-deps``) when there is one, else
Playwright's own (``.venv/bin/playwright install chromium``); ``--chromium`` picks another.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "docs" / "sample-weekly-report.png"
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
    tmp.replace(args.out)
    size = args.out.stat().st_size
    print(f"wrote {args.out} ({size:,} bytes) from {report}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
