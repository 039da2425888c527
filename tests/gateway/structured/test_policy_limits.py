"""The schema limits are a policy section: read from YAML, and a bad value names its line."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.policy.schema import PolicyError, load_policy
from gateway.structured import SchemaRefused, check_client_schema
from tests.gateway.policy.test_schema import write


def test_the_limits_are_read_from_the_policy(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "name: strict\nstructured_output:\n  max_depth: 8\n  max_enum_values: 3\n"
        "  allow_recursive_refs: false\n",
    )
    limits = load_policy(path).policy.structured_output
    assert (limits.max_depth, limits.max_enum_values, limits.allow_recursive_refs) == (8, 3, False)
    assert limits.max_schema_bytes == 65_536  # what it does not name keeps its default
    with pytest.raises(SchemaRefused, match="more than 3 enum values"):
        check_client_schema({"enum": ["a", "b", "c", "d"]}, limits, "response_format")


def test_a_bad_limit_is_reported_with_its_line(tmp_path: Path) -> None:
    path = write(tmp_path, "name: x\nstructured_output:\n  max_depth: 500\n")
    with pytest.raises(PolicyError) as caught:
        load_policy(path)
    issue = caught.value.issues[0]
    assert (issue.field, issue.line, issue.column) == ("structured_output.max_depth", 3, 14)
    assert "less than or equal to 64" in issue.message


def test_a_misspelt_limit_gets_a_did_you_mean(tmp_path: Path) -> None:
    path = write(tmp_path, "name: x\nstructured_output:\n  max_enum_value: 10\n")
    with pytest.raises(PolicyError) as caught:
        load_policy(path)
    issue = caught.value.issues[0]
    assert (issue.field, issue.line) == ("structured_output.max_enum_value", 3)
    assert "did you mean 'max_enum_values'?" in issue.message
