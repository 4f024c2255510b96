"""The command line's store choice and its input checks.

- which audit store a command opens (``--db``, ``GPU_COST_DB``, the ``gpu_cost_db`` connection,
  the nearest ``gpu-cost.toml``, the default: never a file's timestamp), that every command that
  opens one says which (errors included), that a command that only reads never creates or migrates
  one, and that a password never shows;
- small items: ``audit`` finding nothing exits 1, ``forecast eta`` of a job the store has not seen
  says so, ``--since -3d`` is ``--since 3d``;
- durations typed on the command line need a unit (``--for 4`` is refused, ``--for 4h`` works);
- ``--source prometheus`` with no Prometheus configured fails at once, with one line, recording nothing;
- a sweep that acts on nothing says why, finding by finding (``no_action``);
- ``gpu-cost --help`` imports no heavy library.

The session sets ``AIRFLOW_CONN_GPU_COST_DB`` (tests/conftest.py): every test here that depends on
the store resolution sets or deletes it, and the Airflow lookup is switched off
(``GPU_COST_AIRFLOW_LOOKUP=0``) so that an Airflow loaded by another test cannot answer instead.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import time_machine

from gpu_cost.audit.store import AuditStore
from gpu_cost.cli import main as cli
from gpu_cost.cli import options, project
from gpu_cost.cli.commands.sweep import no_action
from gpu_cost.core.errors import GpuCostError
from gpu_cost.core.timeutil import iso, parse_duration_strict
from gpu_cost.perceive import prometheus
from tests.fixtures.core import NOW, ROOT

CONN_ENV = "AIRFLOW_CONN_GPU_COST_DB"
#: what ``no_action`` documents as its outcomes
OUTCOMES = {"dry-run", "notify", "degraded", "protected", "capped", "snoozed", "waiting", "unknown"}
HEAVY = ("pandas", "numpy", "sqlalchemy", "airflow", "matplotlib", "prophet")


@pytest.fixture
def bare_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No store configured anywhere; GPU_COST_HOME an empty folder; the working directory an empty folder."""
    home = tmp_path / "home"
    home.mkdir()
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.setenv("GPU_COST_HOME", str(home))
    monkeypatch.delenv(options.DB_ENV, raising=False)
    monkeypatch.delenv(CONN_ENV, raising=False)
    monkeypatch.setenv("GPU_COST_AIRFLOW_LOOKUP", "0")
    monkeypatch.chdir(work)
    return work


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def one_json(stdout: str) -> dict[str, Any]:
    lines = [line for line in stdout.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one JSON line on stdout, got: {stdout[:500]}"
    return json.loads(lines[0])


def sqlite_conn(path: Path) -> str:
    return json.dumps({"conn_type": "sqlite", "host": str(path)})


# -- which store ----------------------------------------------------------------------------------


def store_at(path: Path) -> AuditStore:
    """Return a store created at head at ``path`` (as a command that writes, or `gpu-cost db upgrade`, makes it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return AuditStore(f"sqlite:///{path}").ensure_schema()


def project_file(folder: Path, body: str) -> Path:
    path = folder / project.FILE_NAME
    path.write_text(body, encoding="utf-8")
    return path


def test_db_flag_beats_env_beats_connection_beats_project_file_beats_default(
        bare_env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    flag, env, conn = tmp_path / "flag.db", tmp_path / "env.db", tmp_path / "conn.db"
    pfile = project_file(bare_env, '[store]\ndb = "stores/audit.db"\n')
    monkeypatch.setenv(options.DB_ENV, str(env))
    monkeypatch.setenv(CONN_ENV, sqlite_conn(conn))

    assert options.resolve_store(str(flag)) == options.StoreChoice(f"sqlite:///{flag}", "--db")
    assert options.resolve_store(None) == options.StoreChoice(f"sqlite:///{env}", "GPU_COST_DB")
    monkeypatch.setenv(options.DB_ENV, "   ")  # blank counts as unset
    assert options.resolve_store(None) == options.StoreChoice(f"sqlite:///{conn}", "connection")
    monkeypatch.delenv(options.DB_ENV)
    assert options.resolve_store("") == options.StoreChoice(f"sqlite:///{conn}", "connection")  # an empty --db too
    monkeypatch.delenv(CONN_ENV)
    named = bare_env / "stores" / "audit.db"
    assert options.resolve_store(None) == options.StoreChoice(f"sqlite:///{named}", "project", str(pfile))
    pfile.unlink()
    default = tmp_path / "home" / "audit.db"
    assert options.resolve_store(None) == options.StoreChoice(f"sqlite:///{default}", "default")


def test_each_origin_is_said_by_name(bare_env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pfile = project_file(bare_env, '[store]\ndb = "a.db"\n')
    choice = options.resolve_store(None)
    assert choice.label() == f"sqlite:///{bare_env / 'a.db'} (project file {pfile})"
    assert choice.to_dict() == {"url": f"sqlite:///{bare_env / 'a.db'}", "origin": "project", "file": str(pfile)}
    assert options.resolve_store("x.db").label().endswith("(from --db)")
    monkeypatch.setenv(CONN_ENV, sqlite_conn(tmp_path / "c.db"))
    assert options.resolve_store(None).label().endswith("(connection gpu_cost_db)")
    monkeypatch.setenv(options.DB_ENV, str(tmp_path / "e.db"))
    assert options.resolve_store(None).label().endswith("(from GPU_COST_DB)")
    pfile.unlink()
    monkeypatch.delenv(options.DB_ENV)
    monkeypatch.delenv(CONN_ENV)
    assert options.resolve_store(None).label().endswith("(default)")


def test_a_relative_db_path_is_made_absolute_from_the_working_directory(bare_env: Path) -> None:
    choice = options.resolve_store("stores/a.db")
    assert choice == options.StoreChoice(f"sqlite:///{bare_env / 'stores' / 'a.db'}", "--db")
    assert options.resolve_store("sqlite:///x.db").url == "sqlite:///x.db"  # a URL is taken as it is


def test_the_nearest_project_file_counts_and_its_paths_count_from_its_folder(
        bare_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    outer = project_file(bare_env, '[store]\ndb = ".demo/audit.db"\n')
    deep = bare_env / "a" / "b"
    deep.mkdir(parents=True)
    monkeypatch.chdir(deep)  # found in a parent, as git finds .git; relative to the file, not to here
    assert options.resolve_store(None) == options.StoreChoice(f"sqlite:///{bare_env / '.demo' / 'audit.db'}", "project",
                                                      str(outer))
    inner = project_file(bare_env / "a", '[store]\ndb = "postgresql://agent:pw@db/gpu"\n')
    near = options.resolve_store(None)  # the nearest one wins; a URL is taken as it is (driver added)
    assert near == options.StoreChoice("postgresql+psycopg2://agent:pw@db/gpu", "project", str(inner))
    assert "pw" not in near.label()
    inner.write_text("# no [store] here\n", encoding="utf-8")
    assert options.resolve_store(None).origin == "default"  # a file that names no store names none


def test_no_timestamp_decides_the_store(bare_env: Path, tmp_path: Path) -> None:
    """The old rule took ./.demo/audit.db when it was newer than the default file: a read elsewhere
    that created the default file silently switched every later command to an empty store."""
    default = store_at(tmp_path / "home" / "audit.db")
    demo = store_at(bare_env / ".demo" / "audit.db")
    later = Path(default.path or "").stat().st_mtime + 10
    os.utime(demo.path or "", (later, later))  # the demo's store is the newer one
    assert options.resolve_store(None) == options.StoreChoice(f"sqlite:///{default.path}", "default")
    pfile = project_file(bare_env, '[store]\ndb = ".demo/audit.db"\n')
    os.utime(default.path or "", (later + 10, later + 10))  # now the default file is the newer one
    assert options.resolve_store(None) == options.StoreChoice(f"sqlite:///{demo.path}", "project", str(pfile))


@pytest.mark.parametrize(("body", "says"), [
    ('[store\ndb = "x"\n', "not valid TOML"),
    ("[store]\ndb = 3\n", "store.db: must be a non-empty string"),
    ('[store]\ndb = ""\n', "store.db: must be a non-empty string"),
    ('[store]\ndatabase = "x.db"\n', "store.database: unknown key"),
    ('[stores]\ndb = "x.db"\n', "[stores]: unknown table"),
    ('store = "x.db"\n', "store: must be a table"),
], ids=["toml", "type", "empty", "key", "table", "not-a-table"])
def test_a_malformed_project_file_is_an_error_naming_the_file_and_the_key(
        bare_env: Path, capsys: pytest.CaptureFixture[str], body: str, says: str) -> None:
    pfile = project_file(bare_env, body)
    with pytest.raises(GpuCostError) as exc:
        options.resolve_store(None)
    assert str(exc.value).startswith(f"{pfile}: ") and says in str(exc.value), str(exc.value)
    code, out, err = run(capsys, "audit", "--job", "1", "--json")
    assert code == 2 and one_json(out)["error"] == str(exc.value)
    assert "Traceback" not in err
    assert options.resolve_store("elsewhere.db").origin == "--db"  # a named store does not read the file


def test_the_project_file_never_beats_a_configured_store(bare_env: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    project_file(bare_env, '[store]\ndb = ".demo/audit.db"\n')
    monkeypatch.setenv(CONN_ENV, sqlite_conn(tmp_path / "conn.db"))
    assert options.resolve_store(None).origin == "connection"
    monkeypatch.setenv(options.DB_ENV, str(tmp_path / "env.db"))
    assert options.resolve_store(None).origin == "GPU_COST_DB"


def test_postgres_urls_get_the_driver_and_never_show_the_password(bare_env: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    choice = options.resolve_store("postgres://u:secret@h/db")
    assert choice == options.StoreChoice("postgresql+psycopg2://u:secret@h/db", "--db")
    assert options.resolve_store("postgresql://u:secret@h:5433/db").url == "postgresql+psycopg2://u:secret@h:5433/db"
    shown = [choice.label(), json.dumps(choice.to_dict())]
    assert choice.to_dict() == {"url": "postgresql+psycopg2://u:***@h/db", "origin": "--db"}
    assert choice.label() == "postgresql+psycopg2://u:***@h/db (from --db)"

    monkeypatch.setenv(options.DB_ENV, "postgresql://agent:s3cr3t@db.example/gpu")
    env = options.resolve_store(None)
    assert env.url == "postgresql+psycopg2://agent:s3cr3t@db.example/gpu" and env.origin == "GPU_COST_DB"
    monkeypatch.delenv(options.DB_ENV)
    monkeypatch.setenv(CONN_ENV, json.dumps({"conn_type": "postgres", "host": "pg", "port": 5432, "login": "agent",
                                             "password": "p@ss/w:rd", "schema": "gpu"}))
    conn = options.resolve_store(None)
    assert conn.origin == "connection" and conn.url.startswith("postgresql+psycopg2://agent:")
    assert conn.label().endswith("(connection gpu_cost_db)")
    for c in (env, conn):
        shown += [c.label(), json.dumps(c.to_dict())]
    for text in shown:
        for secret in ("secret", "s3cr3t", "p@ss", "p%40ss", "w:rd", "w%3Ard"):
            assert secret not in text, text


# -- reading never creates or migrates a store ------------------------------------------------------

#: every command that only reads the store, with the arguments it needs here
READERS = {
    "audit": ["audit", "--job", "1"],
    "report": ["report", "--since", "2026-11-23T00:00:00Z", "--until", "2026-11-30T00:00:00Z"],
    "forecast eta": ["forecast", "eta", "--job", "1003", "--source", "sim", "--at", str(NOW)],
    "power plan": ["power", "plan", "--source", "sim", "--at", str(NOW)],
    "rightsize show": ["rightsize", "show", "--at", str(NOW)],
    "verifier show": ["verifier", "show"],
    "snooze --list": ["snooze", "--list"],
    "db current": ["db", "current"],
}


@pytest.mark.parametrize("argv", list(READERS.values()), ids=list(READERS))
def test_a_command_that_only_reads_never_creates_a_store(bare_env: Path, tmp_path: Path, argv: list[str],
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "absent" / "audit.db"
    code, out, err = run(capsys, *argv, "--db", str(db), "--json")
    payload = one_json(out)
    assert code == 2, (out, err[-2000:])
    assert payload["error"] == (f"no audit store at {db} (from --db): run `gpu-cost db upgrade` (with the same --db) "
                                "or `make demo`, or name one with --db")
    assert payload["store"] == {"url": f"sqlite:///{db}", "origin": "--db"}
    assert not db.parent.exists()  # neither the file nor its folder
    code, out, err = run(capsys, *argv)  # the default store, in text: the error, then the store line
    default = tmp_path / "home" / "audit.db"
    assert code == 2 and out == ""
    assert err.rstrip("\n").splitlines()[-2:] == [
        f"gpu-cost: error: no audit store at {default} (default): run `gpu-cost db upgrade` or `make demo`, or name "
        "one with --db", f"store: sqlite:///{default} (default)"]
    assert list((tmp_path / "home").iterdir()) == []


def test_a_read_refuses_a_store_behind_this_version_and_changes_nothing(
        bare_env: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import sqlalchemy as sa

    from gpu_cost.audit import migrations
    from tests.unit.test_audit_migrations import fill_baseline

    db = tmp_path / "old.db"
    fill_baseline(sa.create_engine(f"sqlite:///{db}"))
    for argv in (READERS["audit"], READERS["power plan"], READERS["snooze --list"]):
        code, out, _ = run(capsys, *argv, "--db", str(db), "--json")
        assert code == 2
        assert one_json(out)["error"] == (
            f"audit store sqlite:///{db} (from --db) is at schema before migrations, this version needs "
            f"{migrations.head()}: run `gpu-cost db upgrade` (with the same --db) to migrate it (every row is kept); "
            "a command that only reads changes nothing")
    assert AuditStore(f"sqlite:///{db}").schema_state()["state"] == "behind"  # not migrated
    code, out, _ = run(capsys, "db", "current", "--db", str(db), "--json")  # says where it stands
    assert code == 0 and one_json(out)["state"] == "behind"
    # a command that writes migrates it, as the DAGs do
    code, out, _ = run(capsys, "snooze", "--target", "job:1", "--for", "1h", "--reason", "benchmarks until tonight", "--db", str(db), "--json")
    assert code == 0 and AuditStore(f"sqlite:///{db}").schema_state()["at_head"]


def test_a_command_that_writes_creates_the_store_it_names(bare_env: Path, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    pfile = project_file(bare_env, '[store]\ndb = "stores/audit.db"\n')
    code, out, err = run(capsys, "snooze", "--target", "job:1", "--for", "1h", "--reason", "benchmarks until tonight", "--json")
    assert code == 0, err[-2000:]
    db = bare_env / "stores" / "audit.db"
    assert one_json(out)["store"] == {"url": f"sqlite:///{db}", "origin": "project", "file": str(pfile)}
    assert AuditStore(f"sqlite:///{db}").schema_state()["at_head"]
    assert not (tmp_path / "home" / "audit.db").exists()


def test_power_plan_after_the_demo_reads_its_store_and_creates_no_other(
        bare_env: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 39: `power plan` created ~/.gpu_cost/audit.db, and `audit --job` then read that empty store."""
    demo = store_at(bare_env / ".demo" / "audit.db")
    code, out, err = run(capsys, "sweep", "--source", "sim", "--mode", "dry-run", "--db", str(bare_env / ".demo" /
                                                                                               "audit.db"),
                         "--at", str(NOW), "--json")
    assert code == 0, err[-2000:]
    pfile = project_file(bare_env, '[store]\ndb = ".demo/audit.db"\n')  # what `gpu-cost demo` writes
    label = f"store: sqlite:///{demo.path} (project file {pfile})"
    code, out, err = run(capsys, "power", "plan", "--source", "sim", "--at", str(NOW))
    assert code == 0, err[-2000:]
    assert out.rstrip("\n").splitlines()[-1] == label
    assert not (tmp_path / "home").joinpath("audit.db").exists()
    code, out, _ = run(capsys, "audit", "--job", "1003")
    lines = out.rstrip("\n").splitlines()
    assert code == 0 and lines[0].endswith("decision(s) for job 1003, oldest first:") and lines[-1] == label


# -- every command that opens the store says which, errors included ----------------------------------


def test_audit_says_which_store(bare_env: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "audit-here.db"
    store_at(db)
    code, out, _ = run(capsys, "audit", "--job", "1", "--db", str(db), "--json")
    payload = one_json(out)
    assert code == 1 and payload["count"] == 0  # nothing found
    assert payload["store"] == {"url": f"sqlite:///{db}", "origin": "--db"}

    code, out, _ = run(capsys, "audit", "--job", "1", "--db", str(db))
    lines = out.rstrip("\n").splitlines()
    assert code == 1 and lines[0] == "no decision recorded for job 1"
    assert lines[-1] == f"store: sqlite:///{db} (from --db)"


def test_audit_without_a_decision_exits_1(bare_env: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = str(tmp_path / "sweep.db")
    _sweep(capsys, Path(db), NOW)
    code, out, _ = run(capsys, "audit", "--job", "999999", "--db", db)
    assert code == 1
    assert out.rstrip("\n").splitlines() == ["no decision recorded for job 999999", f"store: sqlite:///{db} (from --db)"]
    code, out, _ = run(capsys, "audit", "--job", "999999", "--db", db, "--json")
    assert code == 1 and one_json(out)["count"] == 0
    code, out, _ = run(capsys, "audit", "--job", "1003", "--db", db)
    assert code == 0 and "decision(s) for job 1003" in out


def test_audit_names_the_project_file_store(bare_env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    demo = store_at(bare_env / ".demo" / "audit.db")
    pfile = project_file(bare_env, '[store]\ndb = ".demo/audit.db"\n')
    code, out, _ = run(capsys, "audit", "--job", "1", "--json")
    assert one_json(out)["store"] == {"url": f"sqlite:///{demo.path}", "origin": "project", "file": str(pfile)}
    code, out, _ = run(capsys, "audit", "--job", "1")
    assert code == 1 and out.rstrip("\n").splitlines()[-1] == f"store: sqlite:///{demo.path} (project file {pfile})"


def test_audit_from_env_and_connection_says_so(bare_env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    conn = tmp_path / "conn.db"
    store_at(conn)
    monkeypatch.setenv(CONN_ENV, sqlite_conn(conn))
    code, out, _ = run(capsys, "audit", "--job", "1", "--json")
    assert one_json(out)["store"] == {"url": f"sqlite:///{conn}", "origin": "connection"}
    env = tmp_path / "env.db"
    store_at(env)
    monkeypatch.setenv(options.DB_ENV, str(env))
    code, out, _ = run(capsys, "audit", "--job", "1")
    assert code == 1 and out.rstrip("\n").splitlines()[-1] == f"store: sqlite:///{env} (from GPU_COST_DB)"


def test_snooze_list_says_which_store(bare_env: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "snoozes.db"
    store_at(db)
    code, out, _ = run(capsys, "snooze", "--list", "--db", str(db), "--json")
    assert code == 0
    payload = one_json(out)
    assert payload["snoozes"] == []
    assert payload["store"] == {"url": f"sqlite:///{db}", "origin": "--db"}
    code, out, _ = run(capsys, "snooze", "--list", "--db", str(db))
    lines = out.rstrip("\n").splitlines()
    assert code == 0 and lines[0] == "0 snooze(s) in force"
    assert lines[-1].startswith("store: ") and str(db) in lines[-1]


def test_db_current_says_which_store(bare_env: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "schema.db"
    store_at(db)
    code, out, _ = run(capsys, "db", "current", "--db", str(db), "--json")
    assert code == 0
    payload = one_json(out)
    assert payload["at_head"] is True
    assert payload["store"] == {"url": f"sqlite:///{db}", "origin": "--db"}
    code, out, _ = run(capsys, "db", "current", "--url", str(db))  # the older flag is the same --db
    assert code == 0 and out.rstrip("\n").splitlines()[-1] == f"store: sqlite:///{db} (from --db)"


def test_report_says_which_store(bare_env: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db, out_dir = tmp_path / "report.db", tmp_path / "reports"
    store_at(db)
    week = ["--since", "2026-11-23T00:00:00Z", "--until", "2026-11-30T00:00:00Z"]
    code, out, err = run(capsys, "report", *week, "--out", str(out_dir), "--db", str(db), "--json")
    assert code == 0, err[-2000:]
    payload = one_json(out)
    assert payload["store"] == {"url": f"sqlite:///{db}", "origin": "--db"}
    assert Path(payload["index"]).is_file() and Path(payload["index"]).is_relative_to(out_dir)
    code, out, err = run(capsys, "report", *week, "--out", str(out_dir), "--db", str(db))
    assert code == 0, err[-2000:]
    assert out.rstrip("\n").splitlines()[-1] == f"store: sqlite:///{db} (from --db)"


def test_an_error_ends_with_the_store_line(bare_env: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "e.db"
    store_at(db)
    code, out, err = run(capsys, "audit", "--since", "yesterday", "--db", str(db))  # fails before the store opens
    assert code == 2 and out == ""
    assert err.rstrip("\n").splitlines()[-2:] == [
        "gpu-cost: error: --since 'yesterday': not an ISO 8601 date/instant or epoch seconds, nor a duration (e.g. 7d)",
        f"store: sqlite:///{db} (from --db)"]
    code, out, err = run(capsys, "forecast", "eta", "--job", "7", "--db", str(db), "--at", str(NOW), "--json")
    assert code == 2
    assert one_json(out)["store"] == {"url": f"sqlite:///{db}", "origin": "--db"}
    assert err.rstrip("\n").splitlines()[-1] == f"store: sqlite:///{db} (from --db)"
    code, out, err = run(capsys, "policy", "check", str(tmp_path / "none.yaml"), "--json")  # no store: no line
    assert code == 2 and "store" not in one_json(out) and "store:" not in err


# -- small command-line items (issue 39, row 9) ------------------------------------------------------


def test_forecast_eta_of_an_unknown_job_says_it_is_not_among_the_jobs_seen(
        bare_env: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "eta.db"
    store_at(db)
    code, out, _ = run(capsys, "forecast", "eta", "--job", "424242", "--db", str(db), "--at", str(NOW), "--json")
    assert code == 2
    assert one_json(out)["error"] == (f"job 424242: the audit store has no job rows up to {iso(NOW)} (no sweep has "
                                      "recorded a job yet); pass --jobs TRACE or --source sim")
    swept = _sweep(capsys, db, NOW)
    code, out, _ = run(capsys, "forecast", "eta", "--job", "424242", "--db", str(db), "--at", str(NOW), "--json")
    assert code == 2
    jobs = len({d["job_id"] for d in swept["findings"] if d.get("job_id")})
    message = one_json(out)["error"]
    assert message.startswith("job 424242 is not among the ") and f"({iso(NOW)} to {iso(NOW)})" in message, message
    seen = int(message.split("among the ")[1].split(" ")[0])
    assert seen >= jobs >= 1


def test_join_dash_values() -> None:
    assert cli.join_dash_values(["audit", "--since", "-3d", "--json"]) == ["audit", "--since=-3d", "--json"]
    assert cli.join_dash_values(["report", "--until", "-1d", "--since", "-8d"]) == ["report", "--until=-1d",
                                                                                  "--since=-8d"]
    assert cli.join_dash_values(["audit", "--since", "--json"]) == ["audit", "--since", "--json"]  # still an error
    assert cli.join_dash_values(["audit", "--job", "-3d"]) == ["audit", "--job", "-3d"]  # only --since/--until


def test_since_takes_a_leading_minus_as_the_same_time_ago(bare_env: Path, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "since.db"
    store_at(db)
    with time_machine.travel(NOW, tick=False):
        code, out, err = run(capsys, "audit", "--since", "-3d", "--db", str(db), "--json")
        assert code == 1, err[-2000:]  # an empty store: nothing found, but the flag was read
        assert one_json(out)["filters"] == {"since": iso(NOW - 3 * 86400)}
        code, out, _ = run(capsys, "audit", "--since", "3d", "--db", str(db), "--json")
        assert one_json(out)["filters"] == {"since": iso(NOW - 3 * 86400)}
    assert options.instant_arg("-7d", "--until", before=NOW) == options.instant_arg("7d", "--until", before=NOW) == NOW - 7 * 86400
    with pytest.raises(GpuCostError, match="--since '-3x': not "):
        options.instant_arg("-3x", "--since", before=NOW)


# -- durations need a unit ------------------------------------------------------------------------


def test_parse_duration_strict() -> None:
    assert parse_duration_strict("1h30m") == 5400
    assert parse_duration_strict("4h") == 4 * 3600
    assert parse_duration_strict("2d") == 2 * 86400
    for bare in ("4", " 4 ", "4.5", "-3", "0"):
        with pytest.raises(ValueError, match="unit"):
            parse_duration_strict(bare)


def test_duration_arg_names_the_flag_and_the_value() -> None:
    from gpu_cost.core.errors import GpuCostError

    assert options.duration_arg("90m", "--for") == 5400
    with pytest.raises(GpuCostError) as exc:
        options.duration_arg("4", "--for")
    assert str(exc.value).startswith("--for '4': ") and "unit" in str(exc.value)


def test_snooze_for_a_bare_number_is_refused(bare_env: Path, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "snooze.db"
    code, out, err = run(capsys, "snooze", "--target", "job:1", "--for", "4", "--reason", "x", "--db", str(db))
    assert code == 2
    assert out == ""
    assert "--for '4'" in err and "unit" in err
    code, out, err = run(capsys, "snooze", "--target", "job:1", "--for", "4", "--reason", "x", "--db", str(db),
                         "--json")
    assert code == 2
    message = one_json(out)["error"]
    assert "--for '4'" in message and "needs a unit" in message
    assert not db.exists() or AuditStore(f"sqlite:///{db}").active_snoozes(0) == []  # nothing was snoozed


def test_snooze_for_4h_works_and_is_listed(bare_env: Path, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "snooze.db"
    reason = "benchmark runs until tonight"
    code, out, err = run(capsys, "snooze", "--target", "job:1", "--for", "4h", "--reason", reason, "--by", "ann",
                         "--db", str(db), "--json")
    assert code == 0, err[-2000:]
    made = one_json(out)
    assert made["snoozed"] is True and made["target"] == "job:1" and made["by"] == "ann"
    assert made["store"] == {"url": f"sqlite:///{db}", "origin": "--db"}

    code, out, _ = run(capsys, "snooze", "--list", "--db", str(db), "--json")
    assert code == 0
    listed = one_json(out)["snoozes"]
    assert [(s["target"], s["reason"], s["by"], s["snooze_id"]) for s in listed] == \
        [("job:1", reason, "ann", made["snooze_id"])]
    assert listed[0]["until"] == made["until"]
    code, out, _ = run(capsys, "snooze", "--list", "--db", str(db))
    lines = out.rstrip("\n").splitlines()
    assert lines[0] == "1 snooze(s) in force"
    assert "job:1" in lines[1] and reason in lines[1] and "by ann" in lines[1]
    assert lines[-1].startswith("store: ")


# -- --source prometheus without a Prometheus -----------------------------------------------------


def test_sweep_prometheus_unconfigured_fails_in_one_line_and_records_nothing(
        bare_env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from gpu_cost.core import connections

    monkeypatch.delenv(prometheus.URL_ENV, raising=False)
    monkeypatch.delenv(connections.env_var(prometheus.CONN_ID), raising=False)
    db = tmp_path / "prom.db"
    store = AuditStore(f"sqlite:///{db}").ensure_schema()
    before = store.table_counts()

    code, out, err = run(capsys, "sweep", "--source", "prometheus", "--db", str(db), "--json")
    assert code != 0
    message = one_json(out)["error"]
    assert "\n" not in message
    assert message.startswith("--source prometheus: ")
    assert prometheus.URL_ENV in message and prometheus.CONN_ID in message
    assert connections.env_var(prometheus.CONN_ID) in message  # how to set the connection, too
    error_lines = [line for line in err.splitlines() if line.startswith("gpu-cost: error:")]
    assert error_lines == [f"gpu-cost: error: {message}"]
    assert "Traceback" not in err

    after = store.table_counts()
    assert after["gpu_cost_runs"] == 0 and after == before
    assert store.query("SELECT COUNT(*) AS n FROM gpu_cost_decisions")[0]["n"] == 0

    # text form: nothing on stdout, the same one line on stderr
    code, out, err = run(capsys, "sweep", "--source", "prometheus", "--db", str(db))
    assert code != 0 and out == ""
    assert [line for line in err.splitlines() if line.startswith("gpu-cost: error:")] == error_lines


def test_sweep_prometheus_configured_by_env_is_not_refused_up_front(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpu_cost.cli.commands.sweep import require_prometheus
    from gpu_cost.core import connections
    from gpu_cost.core.errors import GpuCostError

    monkeypatch.setenv("GPU_COST_AIRFLOW_LOOKUP", "0")
    monkeypatch.delenv(connections.env_var(prometheus.CONN_ID), raising=False)
    monkeypatch.delenv(prometheus.URL_ENV, raising=False)
    with pytest.raises(GpuCostError, match=prometheus.URL_ENV):
        require_prometheus("prometheus")
    require_prometheus("sim")  # another source needs nothing
    monkeypatch.setenv(prometheus.URL_ENV, "http://127.0.0.1:9")
    require_prometheus("prometheus")  # configured: the check does not contact it


# -- a sweep that acts on nothing says why --------------------------------------------------------


def _sweep(capsys: pytest.CaptureFixture[str], db: Path, at: float) -> dict[str, Any]:
    code, out, err = run(capsys, "sweep", "--source", "sim", "--mode", "dry-run", "--db", str(db), "--at", iso(at),
                         "--json")
    assert code == 0, err[-3000:]
    return one_json(out)


def _acting(out: dict[str, Any]) -> set[tuple[str, str]]:
    return {(d["rule"], d["target"]) for d in out["decisions"]
            if d["action"] != "none" and d["mode"] != "dry-run" and not out["cap_violation"]}


def test_dry_run_sweep_says_why_for_every_finding(bare_env: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "sweep.db"
    out = _sweep(capsys, db, NOW)
    assert out["store"] == {"url": f"sqlite:///{db}", "origin": "--db"}
    assert out["mode"] == "dry-run" and out["findings"], "the default simulated cluster has findings"
    listed = out["no_action"]
    assert listed
    for n in listed:
        assert n["outcome"] in OUTCOMES, n
        assert isinstance(n["why"], str) and n["why"].strip(), n
    keys = [(n["rule"], n["target"]) for n in listed]
    assert len(keys) == len(set(keys))
    findings = {(f["rule"], f["target"]) for f in out["findings"]}
    assert set(keys) <= findings
    assert set(keys) == findings - _acting(out)  # every finding that is not acted on is there
    assert findings - _acting(out) == findings  # dry-run acts on nothing
    by_key = {(n["rule"], n["target"]): n for n in listed}
    for d in out["decisions"]:
        n = by_key[(d["rule"], d["target"])]
        if d["action"] == "none":
            assert n["outcome"] == "protected" and n["why"] == d["reason"]
        else:
            assert n["outcome"] == "dry-run" and n["why"] == f"would {d['action']} (mode dry-run: recorded only)"
    assert "protected" in {n["outcome"] for n in listed}  # job 1007 carries the no-interrupt label

    # the next sweep, 5 minutes on: the ladder waits, and each finding says on what
    later = _sweep(capsys, db, NOW + 300)
    assert later["decisions"] == []
    assert {(n["rule"], n["target"]) for n in later["no_action"]} == {(f["rule"], f["target"])
                                                                       for f in later["findings"]}
    for n in later["no_action"]:
        assert n["outcome"] == "waiting" and n["why"].strip(), n


def test_the_text_form_lists_what_was_held_back(bare_env: Path, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "sweep.db"
    code, out, err = run(capsys, "sweep", "--source", "sim", "--mode", "dry-run", "--db", str(db), "--at", str(NOW))
    assert code == 0, err[-3000:]
    lines = out.rstrip("\n").splitlines()
    assert lines[0].startswith(f"sweep at {iso(NOW)} on sim ")
    held = next(i for i, line in enumerate(lines) if line.startswith("no action on "))
    assert "protected: " in out and "dry-run: would " in out
    assert all(line.startswith("  ") for line in lines[held + 1:-1])
    assert lines[-1] == f"store: sqlite:///{db} (from --db)"


def test_a_snoozed_finding_says_so(bare_env: Path, tmp_path: Path, policy: Any,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    from gpu_cost.decide import snooze

    db = tmp_path / "sweep.db"
    store = AuditStore(f"sqlite:///{db}").ensure_schema()
    snooze.snooze(store, "job:1003", NOW + 4 * 3600, "benchmarks until tonight", "carol", now=NOW, policy=policy)
    out = _sweep(capsys, db, NOW)
    n = next(n for n in out["no_action"] if n["target"] == "job:1003")
    assert n["outcome"] == "snoozed"
    assert "benchmarks until tonight" in n["why"] and "carol" in n["why"]
    assert "job:1003" not in {d["target"] for d in out["decisions"]}


def test_a_snoozed_finding_still_says_so_on_the_next_sweep(bare_env: Path, tmp_path: Path, policy: Any,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    from gpu_cost.decide import snooze

    db = tmp_path / "sweep.db"
    store = AuditStore(f"sqlite:///{db}").ensure_schema()
    snooze.snooze(store, "job:1003", NOW + 4 * 3600, "benchmarks until tonight", "carol", now=NOW, policy=policy)
    _sweep(capsys, db, NOW)
    later = _sweep(capsys, db, NOW + 300)
    n = next(n for n in later["no_action"] if n["target"] == "job:1003")
    assert n["outcome"] == "snoozed", n


def _finding(rule: str, target: str, job_id: str | None = None, user: str | None = "ann") -> dict[str, Any]:
    return {"rule": rule, "target": target, "job_id": job_id, "user": user, "gpus": 1}


def _decision(rule: str, target: str, action: str, mode: str, reason: str) -> dict[str, Any]:
    return {"rule": rule, "target": target, "action": action, "mode": mode, "reason": reason}


def test_no_action_explains_each_kind_of_holding_back() -> None:
    findings = [
        _finding("idle_allocation", "job:1", "1"),  # protected
        _finding("idle_allocation", "job:2", "2"),  # dry-run
        _finding("idle_allocation", "job:3", "3"),  # held back by mode notify
        _finding("idle_allocation", "job:4", "4"),  # degraded data
        _finding("zombie", "proc:g1:10:100"),  # waiting, due in 10 min
        _finding("zombie", "proc:g1:11:100"),  # waiting, with the engine's why
        _finding("zombie", "proc:g1:12:100"),  # waiting, with nothing more
        _finding("low_efficiency", "job:5", "5", "bo"),  # snoozed
        _finding("low_efficiency", "job:6", "6"),  # nothing known
        _finding("idle_allocation", "job:7", "7"),  # acts: not listed
    ]
    decisions = [
        _decision("idle_allocation", "job:1", "none", "dry-run",
                  "job 1: idle 15 min; protected (no-interrupt label): recorded only"),
        _decision("idle_allocation", "job:2", "notify", "dry-run", "job 2: idle 15 min"),
        _decision("idle_allocation", "job:3", "cancel", "dry-run", "job 3: idle 2 h; mode notify: would cancel"),
        _decision("idle_allocation", "job:4", "cancel", "dry-run",
                  "job 4: idle 2 h; degraded data (slurm: timeout): would cancel"),
        _decision("idle_allocation", "job:7", "notify", "enforce", "job 7: idle 15 min"),
    ]
    waiting = [
        {"rule": "zombie", "target": "proc:g1:10:100", "rung": 1, "action": "kill_process", "due_in_s": 600},
        {"rule": "zombie", "target": "proc:g1:11:100", "why": "outside working hours"},
        {"rule": "zombie", "target": "proc:g1:12:100"},
    ]
    snoozed = {("low_efficiency", "job:5"): {"reason": "job 5: snoozed (job:5) until later by bo: exams"}}

    out = no_action(findings, decisions, waiting, None, snoozed)
    got = {n["target"]: (n["outcome"], n["why"]) for n in out}
    assert got == {
        "job:1": ("protected", "job 1: idle 15 min; protected (no-interrupt label): recorded only"),
        "job:2": ("dry-run", "would notify (mode dry-run: recorded only)"),
        "job:3": ("notify", "mode notify holds back cancel (recorded only)"),
        "job:4": ("degraded", "degraded data (slurm: timeout): would cancel"),
        "proc:g1:10:100": ("waiting", "next step kill_process due in 10m (escalation ladder)"),
        "proc:g1:11:100": ("waiting", "outside working hours"),
        "proc:g1:12:100": ("waiting", "waiting on the escalation ladder"),
        "job:5": ("snoozed", "job 5: snoozed (job:5) until later by bo: exams"),
        "job:6": ("unknown", "the engine recorded no decision and no reason"),
    }
    assert [n["target"] for n in out] == [f["target"] for f in findings if f["target"] != "job:7"]  # findings' order
    assert all(n["outcome"] in OUTCOMES and n["why"] for n in out)
    snoozed_row = next(n for n in out if n["target"] == "job:5")
    assert snoozed_row == {"rule": "low_efficiency", "target": "job:5", "job_id": "5", "user": "bo",
                           "outcome": "snoozed", "why": "job 5: snoozed (job:5) until later by bo: exams"}
    assert no_action(findings[:1], decisions[:1], [], None, {})[0]["user"] == "ann"


def test_no_action_lists_capped_decisions_and_keeps_the_rest() -> None:
    findings = [_finding("idle_allocation", "job:1", "1"), _finding("zombie", "proc:g1:10:100"),
                _finding("idle_allocation", "job:2", "2")]
    decisions = [_decision("idle_allocation", "job:1", "cancel", "enforce", "job 1: idle 2 h"),
                 _decision("zombie", "proc:g1:10:100", "kill_process", "enforce", "held 30 GiB idle"),
                 _decision("idle_allocation", "job:2", "notify", "dry-run", "job 2: idle 15 min")]
    cap = "3 destructive actions > max_actions_per_run 2"
    out = no_action(findings, decisions, [], cap, {})
    assert [(n["target"], n["outcome"]) for n in out] == [("job:1", "capped"), ("proc:g1:10:100", "capped"),
                                                         ("job:2", "dry-run")]
    assert out[0]["why"] == f"would cancel, but the run is capped: {cap}"
    assert out[1]["why"] == f"would kill_process, but the run is capped: {cap}"
    assert no_action(findings, decisions, [], None, {}) == [out[2]]  # uncapped, the enforce decisions act
    assert no_action([], decisions, [], cap, {}) == []  # decisions without findings are not listed


# -- the help is fast to print --------------------------------------------------------------------


def test_help_imports_no_heavy_library() -> None:
    code = ("import sys; from gpu_cost.cli import main as cli; cli.build_parser().format_help(); "
            f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "[]"


def test_every_subcommand_help_imports_no_heavy_library() -> None:
    code = ("import argparse, sys; from gpu_cost.cli import main as cli; p = cli.build_parser(); "
            "subs = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction)); "
            "[s.format_help() for s in subs.choices.values()]; "
            f"print(len(subs.choices), sorted(m for m in {HEAVY!r} if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    count, heavy = r.stdout.strip().split(" ", 1)
    assert int(count) >= 5 and heavy == "[]"
