"""`bastion policy check|schema|test`: validate and try policies without the service."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from gateway.policy.cases import guardrail_check_for, load_cases, run_cases
from gateway.policy.schema import PolicyError, load_policy, policy_json_schema
from gateway.settings import Settings


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    policy = commands.add_parser("policy", help="validate, test and describe policies")
    actions = policy.add_subparsers(required=True, metavar="ACTION")
    check = actions.add_parser("check", help="validate policy files; exit 1 on any error")
    check.add_argument("files", nargs="+", type=Path, metavar="FILE")
    check.set_defaults(run=run_check)
    schema = actions.add_parser("schema", help="write the policy JSON Schema")
    schema.add_argument("--output", "-o", type=Path, help="file to write (default: stdout)")
    schema.set_defaults(run=run_schema)
    docs = actions.add_parser("docs", help="write the Markdown policy reference")
    docs.add_argument("--output", "-o", type=Path, help="file to write (default: stdout)")
    docs.set_defaults(run=run_docs)
    test = actions.add_parser("test", help="run example requests against a policy")
    test.add_argument("file", type=Path, metavar="FILE")
    test.add_argument("--cases", type=Path, required=True, metavar="CASES.yaml")
    test.set_defaults(run=run_test)


def run_check(_: Settings, args: argparse.Namespace) -> int:
    failed = 0
    for path in args.files:
        try:
            loaded = load_policy(path)
        except PolicyError as exc:
            failed += 1
            print(exc, file=sys.stderr)
            continue
        print(f"{path}: ok (policy '{loaded.policy.name}', version {loaded.version[:12]})")
    return 1 if failed else 0


def run_schema(_: Settings, args: argparse.Namespace) -> int:
    return _write(json.dumps(policy_json_schema(), indent=2) + "\n", args.output)


def run_docs(_: Settings, args: argparse.Namespace) -> int:
    from gateway.policy.docs import render_policy_reference

    return _write(render_policy_reference(), args.output)


def _write(text: str, output: Path | None) -> int:
    """To `output` when given, else to stdout."""
    if output is None:
        sys.stdout.write(text)
    else:
        output.write_text(text)
        print(f"wrote {output}", file=sys.stderr)
    return 0


def run_test(_: Settings, args: argparse.Namespace) -> int:
    try:
        loaded = load_policy(args.file)
        cases = load_cases(args.cases)
    except PolicyError as exc:
        print(exc, file=sys.stderr)
        return 2
    results = run_cases(cases, guardrail_check_for(loaded))
    for result in results:
        if result.passed:
            print(f"PASS  {result.case.name}")
        else:
            detail = f" ({result.evidence})" if result.evidence else ""
            print(
                f"FAIL  {result.case.name}: expected {result.case.expect}, "
                f"got {result.actual}{detail}"
            )
    failures = sum(not r.passed for r in results)
    print(f"{len(results) - failures} passed, {failures} failed")
    return 1 if failures else 0
