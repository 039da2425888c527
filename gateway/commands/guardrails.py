"""`bastion guardrails check`: a tenant's policy checks on a text, offline, through the
same code path as `POST /v1/guardrails/check`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pydantic import ValidationError

from gateway.audit.entries import CLI_ENDPOINT, admin_action_entry, cli_actor
from gateway.audit.log import AuditLog
from gateway.commands._common import add_data_dir
from gateway.guardrails_check.schemas import GuardrailsCheckRequest, GuardrailsCheckResponse
from gateway.guardrails_check.service import CHECK_EVENT, run_check
from gateway.http.errors import ApiError, from_validation_error
from gateway.policy.runtime import open_policies
from gateway.services import open_database
from gateway.settings import Settings
from retrieval import Embedder


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    guardrails = commands.add_parser("guardrails", help="try a policy's checks on a text")
    actions = guardrails.add_subparsers(required=True, metavar="ACTION")
    check = actions.add_parser(
        "check", help="run a tenant's input (or output) checks on a text; nothing is generated"
    )
    source = check.add_mutually_exclusive_group(required=True)
    source.add_argument("text", nargs="?", metavar="TEXT")
    source.add_argument("--file", type=Path, metavar="F", help="read the text from a file")
    check.add_argument("--tenant", default="default", help="whose policy (default: default)")
    check.add_argument("--direction", choices=("input", "output"), default="input")
    check.add_argument(
        "--check",
        action="append",
        dest="checks",
        metavar="NAME",
        help="report only this check (repeatable)",
    )
    check.add_argument("--json", action="store_true", help="print the response as JSON")
    add_data_dir(check)
    check.set_defaults(run=run_guardrails_check)


def run_guardrails_check(settings: Settings, args: argparse.Namespace) -> int:
    """Exit 0 when the text is allowed or redacted, 1 when blocked, 2 on a bad request."""
    try:
        text = args.text if args.file is None else args.file.read_bytes().decode("utf-8")
        request = GuardrailsCheckRequest(text=text, direction=args.direction, checks=args.checks)
    except UnicodeDecodeError as exc:
        print(f"error: {args.file} is not UTF-8 text ({exc.reason})", file=sys.stderr)
        return 2
    except ValidationError as exc:
        print(f"error: {from_validation_error(exc).message}", file=sys.stderr)
        return 2
    sessions = open_database(settings)
    audit = AuditLog(sessions)
    policies = open_policies(settings.policy_dir, Embedder.load().for_requests(), audit)
    runtime = policies.for_tenant(args.tenant)
    if runtime is None:
        print(
            f"error: no policy in {policies.folder} applies to tenant {args.tenant!r}",
            file=sys.stderr,
        )
        return 2
    try:
        outcome = run_check(runtime, request)
    except ApiError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 2
    response = outcome.response
    entry = admin_action_entry(
        event=CHECK_EVENT,
        actor=cli_actor(),
        endpoint=CLI_ENDPOINT,
        tenant=args.tenant,
        policy_version=runtime.loaded.version,
        details={"direction": request.direction, "decision": response.decision},
    )
    entry.verdicts.extend(outcome.audited)
    audit.record(entry)
    print(response.model_dump_json() if args.json else _summary(response))
    return 1 if response.decision == "block" else 0


def _summary(response: GuardrailsCheckResponse) -> str:
    lines = [f"policy {response.policy} ({response.direction}): {response.decision}"]
    for v in response.verdicts:
        why = "; ".join(v.evidence)
        lines.append(
            f"  {v.check:<18} {v.action:<6} {v.mode:<7} score {v.score:.2f}  "
            f"{v.latency_ms:.1f} ms  {why}"
        )
    if response.text is not None:
        lines.append(f"text: {response.text}")
    return "\n".join(lines)
