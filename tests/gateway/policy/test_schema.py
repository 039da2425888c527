"""Policies: the default loads, and a bad edit names its line and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.policy.schema import PolicyError, load_policy
from gateway.settings import REPO_ROOT


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    return path


def test_default_policy_loads_with_a_content_version() -> None:
    loaded = load_policy(REPO_ROOT / "policies" / "default.yaml")
    assert loaded.policy.name == "default"
    assert loaded.policy.input.injection.mode == "enforce"
    assert len(loaded.version) == 64


def test_version_changes_with_the_content(tmp_path: Path) -> None:
    first = load_policy(write(tmp_path, "name: a\n")).version
    second = load_policy(write(tmp_path, "name: b\n")).version
    assert first != second


def test_unknown_key_is_reported_with_its_line(tmp_path: Path) -> None:
    path = write(tmp_path, "name: x\ninput:\n  injection:\n    enabeld: true\n")
    with pytest.raises(PolicyError) as caught:
        load_policy(path)
    issue = caught.value.issues[0]
    assert issue.field == "input.injection.enabeld"
    assert issue.line == 4
    assert "unknown key" in issue.message
    assert str(path) in str(caught.value)


def test_wrong_type_is_reported_with_its_line(tmp_path: Path) -> None:
    path = write(tmp_path, "name: x\nretrieval:\n  top_k: lots\n")
    with pytest.raises(PolicyError) as caught:
        load_policy(path)
    issue = caught.value.issues[0]
    assert (issue.field, issue.line, issue.column) == ("retrieval.top_k", 3, 10)


def test_missing_name_and_bad_mode_are_both_reported(tmp_path: Path) -> None:
    path = write(tmp_path, "input:\n  pii:\n    mode: sometimes\n")
    with pytest.raises(PolicyError) as caught:
        load_policy(path)
    fields = {issue.field for issue in caught.value.issues}
    assert fields == {"name", "input.pii.mode"}


def test_broken_yaml_is_reported_with_its_line(tmp_path: Path) -> None:
    path = write(tmp_path, "name: x\ninput: [unclosed\n")
    with pytest.raises(PolicyError) as caught:
        load_policy(path)
    assert caught.value.issues[0].line is not None
    assert caught.value.issues[0].field == "(yaml)"


def test_misspelt_key_gets_a_did_you_mean(tmp_path: Path) -> None:
    path = write(tmp_path, "name: x\nretrieval:\n  top_kk: 3\n")
    with pytest.raises(PolicyError) as caught:
        load_policy(path)
    issue = caught.value.issues[0]
    assert (issue.field, issue.line, issue.column) == ("retrieval.top_kk", 3, 3)
    assert "did you mean 'top_k'?" in issue.message


def test_a_policy_extends_another_and_overrides_only_what_it_names(tmp_path: Path) -> None:
    (tmp_path / "base.yaml").write_text(
        "name: base\nmodel:\n  max_tokens: 100\n  system_prompt: Be brief.\n"
    )
    child = tmp_path / "child.yaml"
    child.write_text("name: child\nextends: base\nmodel:\n  max_tokens: 50\n")
    loaded = load_policy(child)
    assert loaded.policy.model.max_tokens == 50
    assert loaded.policy.model.system_prompt == "Be brief."
    before = loaded.version
    (tmp_path / "base.yaml").write_text("name: base\nmodel:\n  system_prompt: Be kind.\n")
    assert load_policy(child).version != before  # the parent is part of the version


def test_errors_in_an_extended_file_point_at_that_file(tmp_path: Path) -> None:
    (tmp_path / "base.yaml").write_text("name: base\nmodel:\n  max_tokens: zero\n")
    child = tmp_path / "child.yaml"
    child.write_text("name: child\nextends: base\n")
    with pytest.raises(PolicyError) as caught:
        load_policy(child)
    issue = caught.value.issues[0]
    assert issue.path == tmp_path / "base.yaml" and issue.line == 3


def test_missing_parent_and_cycles_are_errors(tmp_path: Path) -> None:
    missing = write(tmp_path, "name: x\nextends: nowhere\n")
    with pytest.raises(PolicyError, match="no policy named 'nowhere'"):
        load_policy(missing)
    (tmp_path / "a.yaml").write_text("name: a\nextends: b\n")
    (tmp_path / "b.yaml").write_text("name: b\nextends: a\n")
    with pytest.raises(PolicyError, match="cycle"):
        load_policy(tmp_path / "a.yaml")


def test_json_schema_describes_every_section() -> None:
    from gateway.policy.schema import policy_json_schema

    schema = policy_json_schema()
    assert {"input", "output", "retrieval", "model", "audit", "rate_limits", "applies_to"} <= set(
        schema["properties"]
    )
    assert schema["additionalProperties"] is False
