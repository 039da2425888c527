"""What every sub-command shares: its arguments and an audit record for admin actions."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from gateway.audit.entries import CLI_ENDPOINT, admin_action_entry, cli_actor
from gateway.audit.log import AuditLog


def add_data_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data-dir", type=Path, help="data folder (BASTION_DATA_DIR)")


def record_admin_action(
    sessions: sessionmaker[Session], event: str, tenant: str | None, **details: Any
) -> None:
    """An admin action taken from the CLI is audited like one taken through the API."""
    AuditLog(sessions).record(
        admin_action_entry(
            event=event,
            actor=cli_actor(),
            endpoint=CLI_ENDPOINT,
            tenant=tenant,
            details=details,
        )
    )
