"""The trigger forms read as words, and the operator's policy and tune folders never re-version a DAG.

Airflow 3.3's form draws a param with an ``enum`` as a dropdown and labels each value by the schema's
``values_display``, else by its JSON text: a None reads "null". The dag-processor makes a new DAG
version whenever the hash of a file's serialized DAG changes (``SerializedDagModel.hash``), so what a
DAG file reads while parsed must not depend on the files an operator drops into a folder.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpu_cost.airflow import runtime, tune_tasks
from tests.fixtures.core import ROOT

DAG_IDS = sorted(p.stem for p in (ROOT / "dags").glob("*.py") if not p.name.startswith("_"))
SOURCE_DAGS = ["gpu_forecast_nightly", "gpu_manual_reclaim", "gpu_offhours_power", "gpu_zombie_sweep"]


def _versions() -> dict[str, str]:
    """Parse ``dags/`` and hash each DAG the way the dag-processor does (``_serialize_dags`` → ``dag_hash``)."""
    from airflow.dag_processing.dagbag import DagBag
    from airflow.serialization.serialized_objects import DagSerialization, LazyDeserializedDAG

    bag = DagBag(dag_folder=str(ROOT / "dags"))
    assert bag.import_errors == {}
    return {dag_id: LazyDeserializedDAG(data=DagSerialization.to_dict(dag)).hash for dag_id, dag in bag.dags.items()}


@pytest.mark.slow  # parses every DAG file twice: ~15 s
def test_a_new_policy_or_search_space_file_makes_no_new_dag_version(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    policies, spaces = tmp_path / "policies", tmp_path / "spaces"
    policies.mkdir()
    spaces.mkdir()
    shutil.copy(ROOT / "include" / "policy" / "default.yaml", policies)
    shutil.copy(ROOT / "include" / "tune" / "default.yaml", spaces)
    monkeypatch.setenv("GPU_COST_POLICY_DIR", str(policies))
    monkeypatch.setenv(tune_tasks.TUNE_DIR_ENV, str(spaces))
    before = _versions()
    assert set(before) == set(DAG_IDS)
    (policies / "team-a.yaml").write_text("mode: notify\n")
    (spaces / "narrow.yaml").write_text("rules.zombie.window: [10m, 15m]\n")
    after = _versions()
    changed = sorted(d for d in DAG_IDS if after[d] != before[d])
    assert changed == [], f"adding a policy and a search space file made a new version of {changed}"


def _fields(dagbag: Any) -> Iterator[tuple[str, Any]]:
    for dag in dagbag.dags.values():
        for name in dag.params:
            yield f"{dag.dag_id}.{name}", dag.params.get_param(name)


def _label(schema: dict[str, Any], value: object) -> str:
    """Return what the Airflow 3.3 form's dropdown shows for ``value`` (``FieldDropdown``'s label lookup)."""
    key = "null" if value is None else str(value)
    shown = (schema.get("values_display") or {}).get(key)
    return str(shown) if shown else key


def test_no_form_field_reads_null(dagbag) -> None:  # type: ignore[no-untyped-def]
    bad, dropdowns = [], 0
    for where, param in _fields(dagbag):
        if "enum" not in param.schema:  # free text: the form shows a None as an empty box
            continue
        dropdowns += 1
        if param.value is None:
            bad.append(f"{where}: its default is None")
        for value in param.schema["enum"]:
            label = _label(param.schema, value)
            if label == (str(value) if value is not None else "null") or label.strip().lower() in ("null", "none"):
                bad.append(f"{where}: {value!r} reads {label!r} (no values_display label)")
    assert dropdowns >= 2 + len(SOURCE_DAGS)  # the reclaim form's target kind and action, every data source
    assert bad == []


@pytest.mark.parametrize("dag_id", SOURCE_DAGS)
def test_every_data_source_field_is_the_one_form(dagbag, dag_id: str) -> None:  # type: ignore[no-untyped-def]
    """Defaults to the word "configured"; an older conf's None (REST API, CLI) is still accepted at trigger."""
    from airflow.serialization.serialized_objects import DagSerialization

    param = dagbag.dags[dag_id].params.get_param("source")
    assert param.value == runtime.CONFIGURED_SOURCE == param.schema["enum"][0]
    assert _label(param.schema, None) == "Not set: as configured"
    served = DagSerialization.from_dict(DagSerialization.to_dict(dagbag.dags[dag_id])).params  # what a trigger checks
    for conf in ({}, {"source": None}, {"source": runtime.CONFIGURED_SOURCE}, {"source": "sim"}):
        merged = served.deep_merge(conf).get_param("source").resolve(raises=True)
        assert merged == conf.get("source", runtime.CONFIGURED_SOURCE)


def test_policy_and_space_fields_suggest_the_shipped_names_and_take_typed_ones(dagbag) -> None:  # type: ignore[no-untyped-def]
    for where, param in _fields(dagbag):
        name = where.split(".", 1)[1]
        if name not in ("policy", "space"):
            continue
        shipped = runtime.SHIPPED_POLICIES if name == "policy" else tune_tasks.SHIPPED_SPACES
        assert param.schema["examples"] == list(shipped), where
        assert all(n in (param.description or "") for n in shipped), where
        assert param.resolve("team-a_2026") == "team-a_2026"  # an operator's own name passes the form


@pytest.mark.parametrize(("shipped", "folder"), [(runtime.SHIPPED_POLICIES, "policy"),
                                                 (tune_tasks.SHIPPED_SPACES, "tune")], ids=["policies", "spaces"])
def test_the_shipped_names_are_the_shipped_files(shipped: dict[str, str], folder: str) -> None:
    """The forms' constant lists (no folder read at parse time) name exactly the files ``include/`` ships."""
    assert sorted(shipped) == runtime.named_files(ROOT / "include" / folder)
