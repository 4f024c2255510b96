"""docker-compose.yaml and deploy/: the deployment's files, checked without starting anything.

``docker compose config`` validates the file against the Compose specification when a Docker
Compose v2 client is installed (it needs no Docker engine); the structure is checked with PyYAML
either way: services, healthchecks, mounts, the CeleryExecutor, a separate audit database, no
secret other than the documented development defaults. Prometheus' configuration and the
dashboards' PromQL are checked with ``promtool`` when it is installed.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from tests.fixtures.core import ROOT

COMPOSE = ROOT / "docker-compose.yaml"
DEPLOY = ROOT / "deploy"
DASHBOARDS = DEPLOY / "grafana" / "dashboards"

AIRFLOW_SERVICES = ("airflow-apiserver", "airflow-scheduler", "airflow-dag-processor", "airflow-triggerer",
                    "airflow-worker", "airflow-init")
REQUIRED = (*AIRFLOW_SERVICES, "postgres", "gpu-cost-db", "gpu-cost-db-init", "redis", "prometheus", "grafana")
#: services that run once and exit (no healthcheck: others wait for them to complete)
ONE_SHOT = ("airflow-init", "gpu-cost-db-init", "airflow-cli")
SECRET_KEY = re.compile(r"PASSWORD|SECRET|FERNET|TOKEN|_KEY$|^AIRFLOW_CONN_")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text())  # PyYAML resolves the x-airflow-common anchors and << merges
    assert isinstance(data, dict) and "services" in data
    return data


@pytest.fixture(scope="module")
def env_defaults() -> dict[str, str]:
    """The documented development defaults: ``.env.example``'s NAME=value lines."""
    out = {}
    for line in (ROOT / ".env.example").read_text().splitlines():
        m = re.match(r"([A-Z][A-Z0-9_]*)=(.*)$", line)
        if m:
            out[m.group(1)] = m.group(2)
    return out


def _compose_client() -> list[str] | None:
    for argv in (["docker", "compose"], ["docker-compose"]):
        if shutil.which(argv[0]) is None:
            continue
        r = subprocess.run([*argv, "version"], capture_output=True, text=True)
        if r.returncode == 0 and re.search(r"v?2\.\d+", r.stdout):
            return argv
    return None


def _env(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(e.split("=", 1) for e in env)
    return {k: str(v) for k, v in env.items()}


def _expand(text: str, defaults: dict[str, str] | None = None) -> str:
    """Replace ``${NAME:-default}`` / ``${NAME}`` by the default (what an unset variable gives)."""
    return re.sub(r"\$\{([A-Z0-9_]+)(?::?-([^}]*))?\}", lambda m: (defaults or {}).get(m.group(1), m.group(2) or ""), text)


def test_docker_compose_config_validates() -> None:
    client = _compose_client()
    if client is None:
        pytest.skip("no Docker Compose v2 client here (`docker compose` / `docker-compose` v2): "
                    "the file's structure is still checked by the other tests of this module")
    for profiles in ([], ["--profile", "sim", "--profile", "debug", "--profile", "flower"]):
        r = subprocess.run([*client, "-f", str(COMPOSE), *profiles, "config", "-q"], capture_output=True, text=True,
                           cwd=ROOT, timeout=60)
        assert r.returncode == 0, r.stderr
    r = subprocess.run([*client, "--env-file", str(ROOT / ".env.example"), "-f", str(COMPOSE), "config", "-q"],
                       capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert r.returncode == 0, r.stderr


def test_services_present(compose) -> None:  # type: ignore[no-untyped-def]
    assert sorted(set(REQUIRED) - set(compose["services"])) == []
    assert "x-airflow-common" in compose


def test_every_long_running_service_has_a_healthcheck(compose) -> None:  # type: ignore[no-untyped-def]
    missing = [name for name, s in compose["services"].items()
               if name not in ONE_SHOT and not (s.get("healthcheck") or {}).get("test")]
    assert missing == []
    for name in ONE_SHOT:
        if name in compose["services"]:
            assert compose["services"][name].get("restart") == "no", name


def test_airflow_services_mount_the_project_and_use_celery(compose) -> None:  # type: ignore[no-untyped-def]
    for name in AIRFLOW_SERVICES:
        s = compose["services"][name]
        targets = {v.split(":")[1] for v in s["volumes"]}
        assert {"/opt/airflow/dags", "/opt/airflow/plugins", "/opt/airflow/include"} <= targets, name
        env = _env(s)
        assert env["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor", name
        assert env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"].startswith("http://airflow-apiserver:8080/"), name
        assert "AIRFLOW__API_AUTH__JWT_SECRET" in env and "AIRFLOW__CELERY__BROKER_URL" in env, name
        assert env["GPU_COST_INCLUDE"] == "/opt/airflow/include", name
    mounted = {v.split(":")[0] for v in compose["services"]["airflow-worker"]["volumes"]}
    assert all((ROOT / m).is_dir() for m in ("./dags", "./plugins", "./include") if m in mounted)


def test_worker_is_a_scalable_celery_worker(compose) -> None:  # type: ignore[no-untyped-def]
    worker = compose["services"]["airflow-worker"]
    assert worker["command"] == "celery worker"
    assert "container_name" not in worker and "ports" not in worker  # `--scale airflow-worker=N` needs both absent
    assert _env(worker)["AIRFLOW__CELERY__BROKER_URL"].startswith("redis://redis:") or \
        _env(worker)["AIRFLOW__CELERY__BROKER_URL"].startswith("redis://:@redis:")
    assert "redis" in worker["depends_on"] and worker["depends_on"]["airflow-apiserver"]["condition"] == "service_healthy"


def test_audit_db_is_separate_from_the_metadata_db(compose) -> None:  # type: ignore[no-untyped-def]
    env = _env(compose["services"]["airflow-scheduler"])
    meta = urlsplit(_expand(env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]))
    audit = urlsplit(_expand(env["AIRFLOW_CONN_GPU_COST_DB"]))
    assert meta.hostname == "postgres" and audit.hostname == "gpu-cost-db"
    assert meta.hostname in compose["services"] and audit.hostname in compose["services"]
    assert (meta.hostname, meta.path) != (audit.hostname, audit.path)
    assert audit.username == "gpu_cost_agent"  # least privilege: not the owner, not a superuser
    approver = urlsplit(_expand(env["AIRFLOW_CONN_GPU_COST_DB_APPROVER"]))  # approvals: their own role, same store
    assert (approver.username, approver.hostname, approver.path) == ("gpu_cost_approver", audit.hostname, audit.path)
    db = compose["services"]["gpu-cost-db"]
    assert db["volumes"] != compose["services"]["postgres"]["volumes"]
    init = compose["services"]["gpu-cost-db-init"]
    # migrations to head, then include/sql/grants.postgresql.sql, as the tables' owner
    assert init["entrypoint"] == ["gpu-cost"] and init["command"][:2] == ["db", "upgrade"]
    assert "--no-grants" not in init["command"]
    assert urlsplit(_expand(_env(init)["AIRFLOW_CONN_GPU_COST_DB"])).username == "gpu_cost_owner"
    assert any(v.startswith("./deploy/postgres/initdb.d:/docker-entrypoint-initdb.d") for v in db["volumes"])


def test_connections_come_from_the_environment(compose) -> None:  # type: ignore[no-untyped-def]
    env = _env(compose["services"]["airflow-worker"])
    conns = {k for k in env if k.startswith("AIRFLOW_CONN_")}
    assert {"AIRFLOW_CONN_GPU_COST_DB", "AIRFLOW_CONN_GPU_COST_PROMETHEUS", "AIRFLOW_CONN_GPU_COST_SLURM_SSH",
            "AIRFLOW_CONN_GPU_COST_NODE_SSH", "AIRFLOW_CONN_GPU_COST_SLACK", "AIRFLOW_CONN_GPU_COST_SMTP"} <= conns
    for key in conns - {"AIRFLOW_CONN_GPU_COST_DB", "AIRFLOW_CONN_GPU_COST_DB_APPROVER"}:
        assert env[key].startswith(f"${{{key}:-"), f"{key} must be settable from the environment"


def test_no_secret_but_documented_dev_defaults(compose, env_defaults) -> None:  # type: ignore[no-untyped-def]
    text = COMPOSE.read_text()
    for m in re.finditer(r"(?<!\$)\$\{([A-Z0-9_]+)(?::?-([^}]*))?\}", text):  # $${X}: the container's own
        name, default = m.group(1), m.group(2)
        assert name in env_defaults, f"${{{name}}} is not documented in .env.example"
        if default:
            assert default == env_defaults[name], f"{name}: default {default!r} differs from .env.example"
    for name, service in compose["services"].items():
        for key, value in _env(service).items():
            if not SECRET_KEY.search(key) or key.endswith("_FILE"):  # a path to a secret is no secret
                continue
            literal = re.sub(r"\$\{[^}]*\}", "", value)
            if key.startswith("AIRFLOW_CONN_") or "://" in value:
                assert urlsplit(literal).password in (None, ""), f"{name}: {key} has a literal password"
            else:
                assert literal == "", f"{name}: {key} is a literal secret; use ${{{key}:-...}}"
        for key in ("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "AIRFLOW__CELERY__RESULT_BACKEND"):
            value = _env(service).get(key)
            if value:
                assert urlsplit(re.sub(r"\$\{[^}]*\}", "", value)).password in (None, ""), f"{name}: {key}"
    assert not re.search(r"xox[abp]-|hooks\.slack\.com/services/T|BEGIN [A-Z ]*PRIVATE KEY", text)


def test_env_example_documents_safe_placeholders(env_defaults) -> None:  # type: ignore[no-untyped-def]
    assert env_defaults["AIRFLOW_CONN_GPU_COST_SLACK"] == "" and env_defaults["AIRFLOW__CORE__FERNET_KEY"] == ""
    assert "change-me" in env_defaults["AIRFLOW__API_AUTH__JWT_SECRET"]


def test_dockerfile_builds_on_airflow_and_installs_the_lock_and_the_package() -> None:
    text = (ROOT / "Dockerfile").read_text()
    # the tag, pinned by digest once scripts/pin-base-image.sh has run where the registry is reachable
    assert re.search(r"^FROM apache/airflow:3\.3\.2-python3\.11(@sha256:[0-9a-f]{64})?$", text, re.M)
    assert "requirements.lock" in text and re.search(r"pip install .*-r /tmp/requirements\.lock", text)
    assert re.search(r"pip install .*-e /opt/airflow", text)
    # the DAG processor reads the package's and the DAG files' bytecode instead of compiling them at each parse
    assert re.search(r"python -m compileall -q /opt/airflow/plugins/gpu_cost /opt/airflow/dags$", text, re.M)
    for src in re.findall(r"^COPY (?:--\S+ )*(.+) \S+$", text, re.M):
        for path in src.split():
            assert (ROOT / path).exists(), f"Dockerfile copies {path}, which does not exist"


def test_prometheus_config(tmp_path: Path) -> None:
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    assert {"dcgm", "node"} <= set(jobs)
    assert jobs["dcgm"]["static_configs"][0]["targets"] == ["gpu-sim-exporter:9400"]
    if shutil.which("promtool") is None:
        pytest.skip("promtool is not installed (Debian package prometheus): syntax not checked")
    r = subprocess.run(["promtool", "check", "config", "--syntax-only", str(DEPLOY / "prometheus" / "prometheus.yml")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_recording_rules_are_loaded_and_parse(compose) -> None:  # type: ignore[no-untyped-def]
    from gpu_cost.perceive import recording

    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    assert config["rule_files"] == ["gpu-cost.rules.yml"]  # relative to the config file: /etc/prometheus
    mounts = compose["services"]["prometheus"]["volumes"]
    assert "./deploy/prometheus/gpu-cost.rules.yml:/etc/prometheus/gpu-cost.rules.yml:ro" in mounts
    shipped = ROOT / recording.SHIPPED
    assert shipped.read_text() == recording.rules_yaml(), f"{recording.SHIPPED} drifted: {recording.REGENERATE}"
    if shutil.which("promtool") is None:
        pytest.skip("promtool is not installed (Debian package prometheus): rules not parsed")
    r = subprocess.run(["promtool", "check", "rules", str(shipped)], capture_output=True, text=True)
    assert r.returncode == 0 and "SUCCESS: 22 rules found" in r.stdout, r.stdout + r.stderr


# -- Grafana ---------------------------------------------------------------------------------


def _datasources() -> dict[str, dict[str, Any]]:
    out = {}
    for f in (DEPLOY / "grafana" / "provisioning" / "datasources").glob("*.y*ml"):
        for ds in yaml.safe_load(f.read_text())["datasources"]:
            out[ds["uid"]] = ds
    return out


def _dashboards() -> dict[str, dict[str, Any]]:
    return {f.name: json.loads(f.read_text()) for f in sorted(DASHBOARDS.glob("*.json"))}


def _targets(dashboard: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(p["title"], t) for p in dashboard["panels"] for t in p.get("targets", [])]


def test_grafana_provisioning_matches_compose(compose) -> None:  # type: ignore[no-untyped-def]
    ds = _datasources()
    assert ds["gpu-cost-prometheus"]["url"] == "http://prometheus:9090"
    audit = ds["gpu-cost-audit"]
    assert audit["url"].split(":")[0] == "gpu-cost-db" and audit["user"] == "gpu_cost_reader"
    assert audit["secureJsonData"]["password"] == "${GPU_COST_READER_PASSWORD}"  # from the environment
    assert "GPU_COST_READER_PASSWORD" in _env(compose["services"]["grafana"])
    provider = yaml.safe_load((DEPLOY / "grafana" / "provisioning" / "dashboards" / "gpu-cost.yaml").read_text())
    path = provider["providers"][0]["options"]["path"]
    assert f"./deploy/grafana/dashboards:{path}:ro" in compose["services"]["grafana"]["volumes"]


def test_dashboards_are_complete_and_use_provisioned_sources() -> None:
    dashboards = _dashboards()
    assert set(dashboards) == {"cluster-utilisation.json", "waste-by-team.json", "agent-actions.json"}
    uids = [d["uid"] for d in dashboards.values()]
    assert len(set(uids)) == len(uids)
    ds = _datasources()
    for name, d in dashboards.items():
        ids = [p["id"] for p in d["panels"]]
        assert len(set(ids)) == len(ids), name
        for title, t in _targets(d):
            assert t["datasource"]["uid"] in ds, f"{name}/{title}"
            assert t["datasource"]["type"] == ds[t["datasource"]["uid"]]["type"], f"{name}/{title}"
            assert t.get("expr") or t.get("rawSql"), f"{name}/{title} has no query"
    cluster = json.dumps(dashboards["cluster-utilisation.json"])
    assert "DCGM_FI_DEV_GPU_UTIL" in cluster and "DCGM_FI_PROF_GR_ENGINE_ACTIVE" in cluster
    assert "gpu_cost_usage" in json.dumps(dashboards["waste-by-team.json"])
    actions = json.dumps(dashboards["agent-actions.json"])
    assert all(t in actions for t in ("gpu_cost_decisions", "gpu_cost_actions", "gpu_cost_savings"))


def test_dashboard_promql_parses(tmp_path: Path) -> None:
    if shutil.which("promtool") is None:
        pytest.skip("promtool is not installed (Debian package prometheus): PromQL not parsed")
    exprs = [(f"{name}/{title}", t["expr"]) for name, d in _dashboards().items() for title, t in _targets(d) if "expr" in t]
    assert exprs
    rules = {"groups": [{"name": "dashboards", "rules": [
        {"record": f"dashboard:expr_{i}", "expr": expr.replace("$host", ".*").replace("$__rate_interval", "1m")}
        for i, (_, expr) in enumerate(exprs)]}]}
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump(rules))
    r = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
