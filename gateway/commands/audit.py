"""`bastion audit verify|checkpoint|query|export`: the audit log for reviewers."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime
from pathlib import Path

from sqlalchemy.orm import Session, sessionmaker

from gateway.audit_chain import Checkpoint, make_checkpoint, verify_chain
from gateway.audit_query import AuditFilter, export_lines, iter_records, record_to_dict
from gateway.commands._common import add_data_dir
from gateway.settings import Settings


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    audit = commands.add_parser("audit", help="verify, query and export the audit log")
    actions = audit.add_subparsers(required=True, metavar="ACTION")
    verify = actions.add_parser("verify", help="check the hash chain; exit 1 on tampering")
    verify.add_argument("--checkpoint", type=Path, help="a checkpoint file kept elsewhere")
    add_data_dir(verify)
    verify.set_defaults(run=run_verify)
    checkpoint = actions.add_parser("checkpoint", help="print the chain's head as JSON")
    add_data_dir(checkpoint)
    checkpoint.set_defaults(run=run_checkpoint)
    for name, runner in (("query", run_query), ("export", run_export)):
        sub = actions.add_parser(name, help=f"{name} records matching filters")
        for option in (
            "tenant",
            "key-id",
            "end-user",
            "outcome",
            "event",
            "policy-version",
            "check",
            "verdict",
        ):
            sub.add_argument(f"--{option}")
        sub.add_argument("--since", type=datetime.fromisoformat)
        sub.add_argument("--until", type=datetime.fromisoformat)
        if name == "export":
            sub.add_argument("--format", choices=["jsonl", "csv"], default="jsonl")
        add_data_dir(sub)
        sub.set_defaults(run=runner)


def _filter(args: argparse.Namespace) -> AuditFilter:
    return AuditFilter(
        since=args.since,
        until=args.until,
        tenant=args.tenant,
        key_id=args.key_id,
        end_user=args.end_user,
        outcome=args.outcome,
        event=args.event,
        policy_version=args.policy_version,
        check=args.check,
        verdict=args.verdict,
    )


def _sessions(settings: Settings) -> sessionmaker[Session]:
    from gateway.services import open_database

    return open_database(settings)


def run_verify(settings: Settings, args: argparse.Namespace) -> int:
    checkpoint = Checkpoint.from_json(args.checkpoint.read_text()) if args.checkpoint else None
    report = verify_chain(_sessions(settings), checkpoint)
    for problem in report.problems:
        print(f"TAMPERED: {problem}")
    status = "OK" if report.ok else "FAILED"
    print(f"{status}: {report.records} records, head {report.head_seq} {report.head_hash}")
    return 0 if report.ok else 1


def run_checkpoint(settings: Settings, _: argparse.Namespace) -> int:
    print(make_checkpoint(_sessions(settings)).to_json())
    return 0


def run_query(settings: Settings, args: argparse.Namespace) -> int:
    for record in iter_records(_sessions(settings), _filter(args)):
        print(json.dumps(record_to_dict(record), ensure_ascii=False))
    return 0


def run_export(settings: Settings, args: argparse.Namespace) -> int:
    for piece in export_lines(_sessions(settings), _filter(args), args.format):
        sys.stdout.write(piece)
    return 0
