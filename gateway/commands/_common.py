"""What every sub-command shares: its arguments and an audit record for admin actions."""

from __future__ import annotations

import argparse
import getpass
import uuid
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from gateway.audit.log import AuditEntry, AuditLog


def add_data_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data-dir", type=Path, help="data folder (BASTION_DATA_DIR)")


def record_admin_action(
    sessions: sessionmaker[Session], event: str, tenant: str | None, **details: Any
) -> None:
    """An admin action taken from the CLI is audited like one taken through the API."""
    AuditLog(sessions).record(
        AuditEntry(
            request_id=f"cli_{uuid.uuid4().hex}",
            endpoint="cli",
            event=event,
            tenant=tenant,
            outcome="ok",
            status_code=0,
            details={"actor": f"cli:{getpass.getuser()}", **details},
        )
    )
