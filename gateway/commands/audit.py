"""`bastion audit verify|checkpoint|query|export|purge|erase`: the audit log for reviewers
and for the retention and erasure duties of its operators."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timedelta
from pathlib import Path

from sqlalchemy.orm import Session, sessionmaker

from gateway.audit.chain import PURGE_EVENT, Checkpoint, make_checkpoint, verify_chain
from gateway.audit.entries import cli_actor
from gateway.audit.query import AuditFilter, export_lines, read_records
from gateway.audit.retention import AuditRetentionError, erase_subject, purge_before
from gateway.audit.signing import load_signing_key
from gateway.commands._common import add_data_dir
from gateway.db.models import utc_now
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
    purge = actions.add_parser(
        "purge", help="delete records older than DAYS from the head of the chain"
    )
    purge.add_argument(
        "--older-than",
        type=_days,
        metavar="DAYS",
        help="default: the longest audit.retention_days of the policies in BASTION_POLICY_DIR",
    )
    add_data_dir(purge)
    purge.set_defaults(run=run_purge)
    erase = actions.add_parser(
        "erase", help="destroy a data subject's key: their logged text becomes unreadable"
    )
    erase.add_argument("--subject", required=True, help="the end user id, else the API key id")
    erase.add_argument("--tenant", help="only in this tenant (default: every tenant)")
    add_data_dir(erase)
    erase.set_defaults(run=run_erase)
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


def _policy_retention_days(settings: Settings) -> int:
    """The longest retention any policy asks for: a shared log keeps what any tenant needs."""
    from gateway.policy.schema import PolicyError, load_policy

    days = []
    for path in sorted(settings.policy_dir.glob("*.yaml")):
        try:
            days.append(load_policy(path).policy.audit.retention_days)
        except PolicyError as exc:
            raise ValueError(f"cannot read the retention of {path}: {exc}") from exc
    if not days:
        raise ValueError(f"no policy in {settings.policy_dir}: give --older-than DAYS")
    return max(days)


def _days(value: str) -> int:
    if not value.isdigit():
        raise argparse.ArgumentTypeError(f"DAYS must be a whole number of days, not {value!r}")
    return int(value)


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
    key = _signing_key(settings) if checkpoint and checkpoint.signature else None
    report = verify_chain(_sessions(settings), checkpoint, checkpoint_key=key)
    for problem in report.problems:
        print(f"TAMPERED: {problem}")
    status = "OK" if report.ok else "FAILED"
    print(f"{status}: {report.records} records, head {report.head_seq} {report.head_hash}")
    return 0 if report.ok else 1


def run_checkpoint(settings: Settings, _: argparse.Namespace) -> int:
    sessions = _sessions(settings)
    print(make_checkpoint(sessions, _signing_key(settings)).to_json())
    return 0


def run_query(settings: Settings, args: argparse.Namespace) -> int:
    for record in read_records(_sessions(settings), _filter(args)):
        print(json.dumps(record, ensure_ascii=False))
    return 0


def run_export(settings: Settings, args: argparse.Namespace) -> int:
    for piece in export_lines(_sessions(settings), _filter(args), args.format):
        sys.stdout.write(piece)
    return 0


def run_purge(settings: Settings, args: argparse.Namespace) -> int:
    """Prints the signed checkpoint of the new head: keep it outside the database."""
    sessions = _sessions(settings)
    days = args.older_than if args.older_than is not None else _policy_retention_days(settings)
    cutoff = utc_now() - timedelta(days=days)
    try:
        result = purge_before(
            sessions,
            cutoff,
            _signing_key(settings),
            cli_actor(),
        )
    except AuditRetentionError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if result is None:
        print(f"nothing to purge: no record is older than {cutoff.isoformat()}", file=sys.stderr)
        return 0
    print(
        f"purged records {result.first_seq}..{result.last_seq}; record {result.record.seq} "
        f"({PURGE_EVENT}) vouches for them",
        file=sys.stderr,
    )
    print(result.checkpoint.to_json())
    return 0


def run_erase(settings: Settings, args: argparse.Namespace) -> int:
    result = erase_subject(_sessions(settings), args.subject, args.tenant, cli_actor())
    where = f"tenant {args.tenant}" if args.tenant else "every tenant"
    seqs = ", ".join(str(r.seq) for r in result.records)
    print(
        f"erased {len(result.keys)} key(s) of subject {args.subject!r} in {where}; "
        f"recorded as {seqs}"
    )
    return 0


def _signing_key(settings: Settings) -> bytes:
    return load_signing_key(settings.data_dir, settings.audit_signing_key)
