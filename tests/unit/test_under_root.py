"""A run's param names something under a root the deployment configured, never a path (one resolver)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_cost.airflow import runtime
from gpu_cost.airflow.runtime import RunParamError, under_root


@pytest.fixture
def root(tmp_path: Path) -> Path:
    folder = tmp_path / "root"
    (folder / "team-a").mkdir(parents=True)
    (folder / "jobs.csv").write_text("job_id\n")
    (tmp_path / "secret.csv").write_text("x\n")
    (folder / "out").symlink_to(tmp_path)  # leads out of the root
    (folder / "alias").symlink_to(folder / "team-a")  # stays inside
    return folder


@pytest.mark.parametrize(("name", "nested", "expected"),
                         [("jobs.csv", False, "jobs.csv"), ("team-a", True, "team-a"),
                          ("team-a/q4", True, "team-a/q4"), ("alias/x.csv", True, "alias/x.csv"),
                          ("new_folder.2026", True, "new_folder.2026")],
                         ids=["file", "folder", "sub-folder", "symlink-inside", "not-yet-there"])
def test_a_name_resolves_under_the_root(root: Path, name: str, nested: bool, expected: str) -> None:
    assert under_root(root, name, param="p", nested=nested) == root / expected


@pytest.mark.parametrize(("name", "why"),
                         [("/etc/passwd", "an absolute path"), ("~root/x", "an absolute path"),
                          ("\\\\server\\share", "an absolute path"),
                          ("s3://bucket/x", "a URL"), ("file:///etc/passwd", "a URL"), ("http://h/jobs.csv", "a URL"),
                          ("../secret.csv", "'..' is not allowed"), ("team-a/../../secret.csv", "'..' is not allowed"),
                          ("team-a/..", "'..' is not allowed"), ("", "not a name"), (None, "not a name"),
                          (".hidden", "not a name"), ("a//b", "not a name"), ("a/", "not a name"),
                          ("jobs.csv\n", "not a name"), ("a b", "not a name"), ("x;rm -rf /", "not a name"),
                          ("out/secret.csv", "leads out of"), ("out", "leads out of")],
                         ids=lambda v: repr(v)[:20])
def test_paths_urls_and_escapes_are_refused_naming_the_param(root: Path, name: object, why: str) -> None:
    with pytest.raises(RunParamError, match=rf"^param 'out_dir' = .* refused: .*{why}") as err:
        under_root(root, name, param="out_dir", nested=True)
    assert err.value.param == "out_dir"


def test_a_flat_name_may_not_go_into_folders(root: Path) -> None:
    with pytest.raises(RunParamError, match=r"param 'policy' .* not a name"):
        under_root(root, "team-a/x.yaml", param="policy")


def test_a_url_root_gets_the_name_appended(root: Path) -> None:
    assert under_root("s3://bucket/reports/", "team-a/q4", param="out_dir", nested=True) == "s3://bucket/reports/team-a/q4"
    with pytest.raises(RunParamError, match=r"'\.\.' is not allowed"):
        under_root("s3://bucket/reports", "../other", param="out_dir", nested=True)


def test_policies_are_chosen_through_the_same_resolver(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpu_cost.core.errors import PolicyError

    folder = tmp_path / "policies"
    folder.mkdir()
    (tmp_path / "loose.yaml").write_text("mode: enforce\n")
    (folder / "escape.yaml").symlink_to(tmp_path / "loose.yaml")
    (folder / "prod.yaml").write_text("mode: enforce\n")
    monkeypatch.setenv("GPU_COST_POLICY_DIR", str(folder))
    assert runtime.resolve_policy("prod") == folder / "prod.yaml"
    with pytest.raises(PolicyError, match="not a policy of the deployment's policy directory"):
        runtime.resolve_policy("escape")
    with pytest.raises(PolicyError, match="not a policy of the deployment's policy directory"):
        runtime.resolve_policy("prod\n")
