"""`bastion keys create|list|revoke`: API keys, shown once and stored as hashes."""

from __future__ import annotations

import argparse
import sys
from datetime import timedelta

from gateway.commands._common import add_data_dir, record_admin_action
from gateway.db.models import utc_now
from gateway.keys.store import ROLES, create_key, list_keys, revoke_key, rotate_key
from gateway.keys.tenant_binding import tenants_bound_in, unbound_tenant_warning
from gateway.settings import Settings


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    keys = commands.add_parser("keys", help="manage API keys")
    actions = keys.add_subparsers(required=True, metavar="ACTION")
    create = actions.add_parser("create", help="create a key and print it once")
    create.add_argument("--tenant", required=True)
    create.add_argument("--role", required=True, choices=ROLES)
    create.add_argument("--expires-in-days", type=int, metavar="DAYS", help="default: never")
    create.add_argument("--requests-per-minute", type=int, help="this key's own request limit")
    create.add_argument("--tokens-per-minute", type=int, help="this key's own token budget")
    add_data_dir(create)
    create.set_defaults(run=run_create)
    listing = actions.add_parser("list", help="list keys (never their secrets)")
    listing.add_argument("--tenant")
    add_data_dir(listing)
    listing.set_defaults(run=run_list)
    rotate = actions.add_parser("rotate", help="replace a key; print the new one once")
    rotate.add_argument("key_id")
    rotate.add_argument(
        "--grace-seconds", type=int, default=0, help="keep the old key working this long"
    )
    add_data_dir(rotate)
    rotate.set_defaults(run=run_rotate)
    revoke = actions.add_parser("revoke", help="revoke a key at once")
    revoke.add_argument("key_id")
    add_data_dir(revoke)
    revoke.set_defaults(run=run_revoke)


def run_create(settings: Settings, args: argparse.Namespace) -> int:
    from gateway.services import open_database

    sessions = open_database(settings)
    expires_at = None
    if args.expires_in_days is not None:
        if args.expires_in_days < 1:
            raise ValueError("--expires-in-days must be at least 1")
        expires_at = utc_now() + timedelta(days=args.expires_in_days)
    secret, identity = create_key(
        sessions,
        args.tenant,
        args.role,
        expires_at=expires_at,
        requests_per_minute=args.requests_per_minute,
        tokens_per_minute=args.tokens_per_minute,
    )
    record_admin_action(
        sessions, "admin.key_created", identity.tenant, key=identity.key_id, role=identity.role
    )
    print(secret)
    print(
        f"key id {identity.key_id}, tenant {identity.tenant}, role {identity.role}. "
        "This is the only time the key is shown.",
        file=sys.stderr,
    )
    if identity.tenant not in tenants_bound_in(settings.policy_dir):
        print(
            f"warning: {unbound_tenant_warning(identity.tenant, settings.policy_dir)}",
            file=sys.stderr,
        )
    return 0


def run_list(settings: Settings, args: argparse.Namespace) -> int:
    from gateway.services import open_database

    for key in list_keys(open_database(settings), args.tenant):
        state = "revoked" if key.revoked else "active"
        created = key.created_at.isoformat(timespec="seconds")
        print(f"{key.key_id}  {key.prefix}...  {key.tenant}  {key.role}  {created}  {state}")
    return 0


def run_rotate(settings: Settings, args: argparse.Namespace) -> int:
    from gateway.services import open_database

    sessions = open_database(settings)
    rotated = rotate_key(sessions, args.key_id, grace=timedelta(seconds=args.grace_seconds))
    if rotated is None:
        print(f"error: no active key with id {args.key_id}", file=sys.stderr)
        return 1
    secret, identity = rotated
    record_admin_action(
        sessions, "admin.key_rotated", identity.tenant, old_key=args.key_id, key=identity.key_id
    )
    print(secret)
    print(
        f"key id {identity.key_id} replaces {args.key_id}. This is the only time the key is shown.",
        file=sys.stderr,
    )
    return 0


def run_revoke(settings: Settings, args: argparse.Namespace) -> int:
    from gateway.services import open_database

    sessions = open_database(settings)
    identity = revoke_key(sessions, args.key_id)
    if identity is None:
        print(f"error: no key with id {args.key_id}", file=sys.stderr)
        return 1
    record_admin_action(sessions, "admin.key_revoked", identity.tenant, key=identity.key_id)
    print(f"revoked {identity.key_id} ({identity.tenant}, {identity.role})")
    return 0
