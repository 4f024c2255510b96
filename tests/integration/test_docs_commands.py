"""Every ``gpu-cost`` command the documentation shows runs, from a fresh clone's files.

Pages: ``README.md`` and every page under ``docs/``. Commands: the lines of ``bash``, ``console``,
``sh`` and ``shell`` fences, and of fences with no language, that start with ``gpu-cost`` or
``.venv/bin/gpu-cost`` (a ``$`` prompt dropped, ``\\`` continuations joined). ``text`` fences are
synopses (the generated command-line reference), not commands. A fence right after
``<!-- not-run: REASON -->`` is not run; :data:`SKIP` names the other commands that cannot run
here, each with its reason.

Each page's commands run in order, with bash, in a copy of the repository's files made once for
the session (those ``git ls-files`` lists: what a clone holds, this checkout's ``.venv`` linked in
as after ``make setup``), with that copy's package first on ``PYTHONPATH`` and a fresh
``GPU_COST_HOME`` whose default audit store one simulated sweep made once for the session (what
``audit``, ``report`` and the other readers of a store need). Each must exit 0, or the code an
``# exit N`` comment on its line names.

Mapped for time on a loaded 2-core machine: ``--days`` above 1 runs 1 day, ``--gpus`` above 16 runs
16 GPUs (enough for a replay to find waste), and the commands of :data:`FEWER` get the options that
make them do less; ``/tmp/`` is a folder of the copy (the commands write traces there). A command
runs once in the session, as run here (a comment aside): a page that shows it again, or another
page that shows it too, is held to that run's exit code. The files and rows a command leaves stay
for the commands after it, on its page and on the others, as they would for a reader who follows
the pages one after another.
"""

from __future__ import annotations

import compileall
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.fixtures.core import ROOT

#: fence languages whose ``gpu-cost`` lines are commands (an unnamed fence counts too)
SHELL_FENCES = frozenset({"", "bash", "console", "sh", "shell"})
#: (page, start of the command) → why it does not run here
SKIP: dict[tuple[str, str], str] = {
    ("docs/operator-guide.md", "gpu-cost demo"): "the whole demo through Airflow (minutes): tests/e2e/"
                                                 "test_demo_deterministic.py::test_demo_as_a_new_user_runs_it_and_"
                                                 "prints_the_same_summary_twice runs it",
}
NOT_RUN = re.compile(r"<!--\s*not-run:\s*(?P<why>.+?)\s*-->")
FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>```+|~~~+)\s*(?P<lang>[\w+-]*)")
COMMAND = re.compile(r"^(?:\$\s+)?(?P<cmd>(?:\.venv/bin/)?gpu-cost(?:\s.*)?)$")
EXIT = re.compile(r"#\s*exits?\s+(?P<code>\d+)\b")
#: the most a command here simulates (the documented sizes take minutes on 2 cores)
MAX_DAYS, MAX_GPUS = 1, 16
#: start of a command → the options (and values) it runs with here, each unless the page gives it: tune
#: draws 2 candidates; the power replay plays 2 of Slurm's SuspendTimes and 2 forecast quantiles (its
#: frontiers, and their plot, on 2 points each instead of 12 and 6); a generated trace ends at one instant (its
#: default, the start of the current hour, made what the commands after it find depend on the hour the suite ran:
#: a tune of 2 candidates found none better than the base at 20:00 on a Monday, and wrote nothing)
FEWER: dict[str, tuple[tuple[str, str], ...]] = {
    "gpu-cost sim-trace": (("--end", "2026-11-02T00:00:00Z"),),
    "gpu-cost tune": (("--max-candidates", "2"),),
    "gpu-cost power replay": (("--suspend-times", "30m,4h"), ("--quantiles", "0.5,0.9")),
}
#: the longest one command may take here
COMMAND_TIMEOUT_S = 300
#: variables of this test session that must not reach a user's command
SESSION_VARS = ("AIRFLOW_CONN_GPU_COST_DB", "GPU_COST_DB", "GPU_COST_POLICY", "GPU_COST_SCENARIO",
                "GPU_COST_INCLUDE", "GPU_COST_DAGS", "GPU_COST_REPORT_DIR", "GPU_COST_POLICY_DIR", "GPU_COST_SOURCE")


@dataclass(frozen=True)
class Command:
    page: str
    line: int
    text: str
    exit_code: int = 0
    skip: str | None = None


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def commands(page: Path, rel: str | None = None) -> list[Command]:
    """Return the page's shell commands, in order, each with the exit code it must give.

    :param rel: the page's path as :data:`SKIP` names it (default: relative to the repository).
    """
    rel = rel or page.relative_to(ROOT).as_posix()
    out: list[Command] = []
    lines = page.read_text(encoding="utf-8").splitlines()
    fence: str | None = None
    run, not_run = False, None
    pending: tuple[int, str] | None = None
    for i, line in enumerate(lines, 1):
        m = FENCE.match(line)
        if fence is None:
            if m:
                fence = m.group("fence")
                run = m.group("lang").lower() in SHELL_FENCES
                prev = next((x for x in reversed(lines[:i - 1]) if x.strip()), "")
                hit = NOT_RUN.search(prev)
                not_run = hit.group("why") if hit else None
            continue
        if m and line.strip().startswith(fence) and not line.strip().strip(fence[0]):
            fence = None
            continue
        if not run:
            continue
        if pending is not None:
            start, text = pending
            text += " " + line.strip()
        else:
            c = COMMAND.match(line.strip())
            if not c:
                continue
            start, text = i, c.group("cmd")
        if text.rstrip().endswith("\\"):
            pending = (start, text.rstrip()[:-1].rstrip())
            continue
        pending = None
        code = EXIT.search(text)
        skip = not_run or next((why for (p, head), why in SKIP.items() if p == rel and text.startswith(head)), None)
        out.append(Command(rel, start, text, int(code.group("code")) if code else 0, skip))
    return out


def shrink(text: str, folder: Path) -> str:
    """Return the command as run here: small simulations, ``/tmp/`` inside ``folder``."""
    text = re.sub(r"--days\s+([\d.]+)", lambda m: f"--days {min(float(m.group(1)), MAX_DAYS):g}", text)
    text = re.sub(r"--gpus\s+(\d+)", lambda m: f"--gpus {min(int(m.group(1)), MAX_GPUS)}", text)
    for head, options in FEWER.items():
        if text.startswith(head + " "):
            extra = "".join(f" {flag} {value}" for flag, value in options if flag not in text)
            text = text.replace(head, head + extra, 1)
    return re.sub(r"(?<![\w./])/tmp/", f"{folder}/tmp/", text)


# -- the session: a clone's files and a store ------------------------------------------------------
@pytest.fixture(scope="session")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Return a copy of the files a clone of the repository holds (tracked, and new files not ignored)."""
    git = shutil.which("git")
    if git is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the files a clone holds are unknown")
    listed = subprocess.run([git, "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout.decode().split("\0")
    dest = tmp_path_factory.mktemp("clone")
    for rel in filter(None, listed):
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    compileall.compile_dir(dest / "plugins", quiet=1)  # as `make setup` leaves a clone's package
    return dest


def _env(clone: Path, home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in SESSION_VARS}
    env.update({"PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
                "PYTHONPATH": str(clone / "plugins"), "GPU_COST_HOME": str(home), "COLUMNS": "120"})
    return env


@pytest.fixture(scope="session")
def store_home(clone: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Return a fresh ``GPU_COST_HOME`` whose default store a sweep of the simulated cluster wrote.

    What the demo's store holds for the commands the pages show after ``make demo``: decisions about
    job 1003, a leftover process, usage rows.
    """
    home = tmp_path_factory.mktemp("gpu_cost_home")
    r = subprocess.run(["gpu-cost", "sweep", "--source", "sim"], cwd=clone, env=_env(clone, home),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return home


@dataclass(frozen=True)
class Ran:
    """What one command did: its exit code (None: it ran past :data:`COMMAND_TIMEOUT_S`), output and time."""

    as_run: str
    code: int | None
    stdout: str
    stderr: str
    seconds: float


class Shell:
    """Runs commands with bash in one copy of the clone; each distinct command (as run here) once."""

    def __init__(self, folder: Path, env: dict[str, str]) -> None:
        self.folder, self.env = folder, env
        self.ran: dict[str, Ran] = {}

    def run(self, c: Command) -> Ran:
        cmd = shrink(c.text, self.folder)
        key = re.sub(r"\s+#[^'\"]*$", "", cmd)
        if key not in self.ran:
            started = time.monotonic()
            try:
                r = subprocess.run(["bash", "-c", cmd], cwd=self.folder, env=self.env, capture_output=True, text=True,
                                   timeout=COMMAND_TIMEOUT_S)
                code, out, err = r.returncode, r.stdout, r.stderr
            except subprocess.TimeoutExpired:
                code, out, err = None, "", ""
            self.ran[key] = Ran(cmd, code, out, err, time.monotonic() - started)
        return self.ran[key]


@pytest.fixture(scope="session")
def shell(clone: Path, store_home: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shell]:
    """Return the session's shell: a copy of the clone, ``.venv`` linked in as after ``make setup``."""
    folder = tmp_path_factory.mktemp("docs") / "clone"
    shutil.copytree(clone, folder, symlinks=True)
    (folder / ".venv").symlink_to(Path(sys.prefix), target_is_directory=True)
    (folder / "tmp").mkdir()
    yield Shell(folder, _env(folder, store_home))


# -- the checks ------------------------------------------------------------------------------------
def test_the_extractor_reads_fences_continuations_markers_and_exit_codes(tmp_path: Path) -> None:
    page = tmp_path / "x.md"
    page.write_text("```bash\n$ gpu-cost sweep --source sim \\\n    --json   # one sweep\nexport A=1\n```\n\n"
                    "```text\ngpu-cost report [--since SINCE]\n```\n"
                    "<!-- not-run: needs a real cluster -->\n```\ngpu-cost sweep --source prometheus\n```\n"
                    "```console\n.venv/bin/gpu-cost policy check nope.yaml   # exits 2\n```\n"
                    "```bash\ngpu-cost demo --json\n```\n", encoding="utf-8")
    assert [(c.line, c.text, c.exit_code, c.skip) for c in commands(page, "docs/operator-guide.md")] == [
        (2, "gpu-cost sweep --source sim --json   # one sweep", 0, None),
        (12, "gpu-cost sweep --source prometheus", 0, "needs a real cluster"),
        (15, ".venv/bin/gpu-cost policy check nope.yaml   # exits 2", 2, None),
        (18, "gpu-cost demo --json", 0, SKIP[("docs/operator-guide.md", "gpu-cost demo")]),
    ]
    assert shrink("gpu-cost sim-trace --days 7 --gpus 128 --out /tmp/t", tmp_path) == \
        f"gpu-cost sim-trace --end 2026-11-02T00:00:00Z --days 1 --gpus 16 --out {tmp_path}/tmp/t"
    assert shrink("gpu-cost sim-trace --end 2026-01-05 --out t", tmp_path) == "gpu-cost sim-trace --end 2026-01-05 --out t"
    assert shrink("gpu-cost tune --samples s.parquet", tmp_path) == "gpu-cost tune --max-candidates 2 --samples s.parquet"
    assert shrink("gpu-cost tune --max-candidates 5", tmp_path) == "gpu-cost tune --max-candidates 5"
    assert shrink("gpu-cost power replay --series s.csv --quantiles 0.9 --plot /tmp/f.png", tmp_path) == \
        f"gpu-cost power replay --suspend-times 30m,4h --series s.csv --quantiles 0.9 --plot {tmp_path}/tmp/f.png"


def test_every_placeholder_is_gone_from_the_commands() -> None:
    """Commands are examples a user can paste: no ``<id>``, no ``[--optional]`` synopsis, no ``a|b``."""
    bad = [f"{c.page}:{c.line}: {c.text}" for p in pages() for c in commands(p) if c.skip is None and
           re.search(r"<[a-z_ -]+>|\s\[-|\w\|\w|\.\.\.", c.text.split("#")[0])]
    assert not bad, "placeholders in documented commands (write a runnable example):\n" + "\n".join(bad)


def test_the_cli_reference_says_report_since_takes_a_duration() -> None:
    """``report --since 7d`` (the README's) is what the generated reference documents, from the parser's help."""
    row = next(line for line in (ROOT / "docs" / "reference" / "cli.md").read_text().split("## `gpu-cost report`")[1]
               .splitlines() if line.startswith("| `--since`"))
    assert "duration" in row and "7d" in row, row


@pytest.mark.slow
@pytest.mark.parametrize("page", [p for p in pages() if commands(p)], ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_documented_command_runs(page: Path, shell: Shell) -> None:
    failed = []
    for c in commands(page):
        if c.skip:
            continue
        r = shell.run(c)
        if r.code is None:
            failed.append(f"{c.page}:{c.line}: `{c.text}` ran past {COMMAND_TIMEOUT_S} s (as run here: `{r.as_run}`)")
        elif r.code != c.exit_code:
            failed.append(f"{c.page}:{c.line}: `{c.text}` exited {r.code}, not {c.exit_code} ({r.seconds:.0f} s, "
                          f"as run here: `{r.as_run}`):\n{r.stdout[-1000:]}\n{r.stderr[-1000:]}")
    assert not failed, "\n\n".join(failed)
