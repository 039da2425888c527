"""Hot reload on a live server: good edits apply, bad edits keep the last good policy,
and requests made meanwhile all succeed."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import httpx
from sqlalchemy import select

from gateway.db.models import AuditRecord
from gateway.keys.store import create_key
from tests.integration.conftest import LiveServer


def wait_for(condition: Callable[[], bool], timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def test_hot_reload_while_serving(live_server: LiveServer) -> None:
    policy_file = live_server.settings.policy_dir / "default.yaml"
    original = policy_file.read_text()
    v1 = live_server.policy_version
    statuses: list[int] = []
    versions: list[str] = []
    stop = threading.Event()

    def traffic() -> None:
        with httpx.Client(headers={"authorization": f"Bearer {live_server.api_key}"}) as client:
            while not stop.is_set():
                response = client.post(
                    f"{live_server.base_url}/v1/chat/completions",
                    json={
                        "messages": [{"role": "user", "content": "Hi"}],
                        "max_tokens": 2,
                        "temperature": 0,
                    },
                    timeout=60,
                )
                statuses.append(response.status_code)
                rows = live_server.audit_rows(response.headers["x-request-id"])
                versions.append(rows[0].policy_version or "")

    worker = threading.Thread(target=traffic)
    worker.start()
    try:
        time.sleep(0.5)
        policy_file.write_text(original.replace("Balanced defaults", "Edited defaults"))
        wait_for(lambda: live_server.policy_version != v1)
        v2 = live_server.policy_version
        wait_for(lambda: v2 in versions)

        policy_file.write_text(original + "\nretrieval:\n  top_kk: 3\n")
        wait_for(lambda: any(s.error for s in live_server.services.policies.status()))
        time.sleep(0.5)
        assert live_server.policy_version == v2  # the last good policy stays active
        count = len(versions)
        wait_for(lambda: len(versions) > count + 1)
    finally:
        stop.set()
        worker.join(timeout=60)
        policy_file.write_text(original)
        wait_for(lambda: not any(s.error for s in live_server.services.policies.status()))

    assert statuses and all(code == 200 for code in statuses), statuses
    assert versions[0] == v1 and versions[-1] == v2

    admin, _ = create_key(live_server.services.sessions, "default", "admin")
    status = httpx.get(
        f"{live_server.base_url}/admin/policies",
        headers={"authorization": f"Bearer {admin}"},
        timeout=30,
    ).json()
    assert status["reload_failures"] >= 1

    with live_server.services.sessions() as session:
        reloads = list(
            session.scalars(select(AuditRecord).where(AuditRecord.event.like("policy.%")))
        )
    changed = [r for r in reloads if r.event == "policy.reloaded" and r.details["old_version"]]
    assert any(r.details["old_version"] == v1 and r.details["new_version"] == v2 for r in changed)
    assert any(r.event == "policy.reload_failed" for r in reloads)
