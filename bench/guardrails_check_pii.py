"""PII redaction measured end to end: the synthetic PII sentences of `guardrails_pii`
sent through `POST /v1/guardrails/check` on the real app behind uvicorn, counting the
values that no longer appear in the text the model would receive."""

from __future__ import annotations

import logging
import shutil
import tempfile
from collections import Counter
from pathlib import Path

import httpx
from confusion import ratio
from guardrails_pii import TEMPLATES, labelled_sentences

from gateway.keys.store import create_key
from gateway.services import load_services
from gateway.settings import REPO_ROOT, Settings
from tests.support.local_server import free_port, serve_in_thread

ALL_ENTITIES_TENANT = "pii-bench-all"


def _all_entities_policy(default: str) -> str:
    """The default policy with all eight benchmarked entities, for another tenant."""
    entities = "[" + ", ".join(TEMPLATES) + "]"
    policy = default.replace("name: default", "name: pii-bench-all").replace(
        "[default]", f"[{ALL_ENTITIES_TENANT}]"
    )
    old = "    entities: [EMAIL_ADDRESS, PHONE_NUMBER, CREDIT_CARD, US_SSN, IBAN_CODE, IP_ADDRESS]"
    assert old in policy
    return policy.replace(old, f"    entities: {entities}", 1)


def bench_pii_endpoint(per_entity: int = 30, seed: int = 7) -> list[str]:
    """Recall per entity through the check endpoint, with the default policy and with one
    that enables all eight entities."""
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request otherwise
    with tempfile.TemporaryDirectory(prefix="bastion-pii-bench-") as tmp:
        data_dir, policy_dir = Path(tmp) / "data", Path(tmp) / "policies"
        data_dir.mkdir()
        policy_dir.mkdir()
        shutil.copy(REPO_ROOT / "policies" / "default.yaml", policy_dir / "default.yaml")
        default = (policy_dir / "default.yaml").read_text()
        (policy_dir / "all.yaml").write_text(_all_entities_policy(default))
        settings = Settings(data_dir=data_dir, port=free_port(), policy_dir=policy_dir)
        services = load_services(settings)
        keys = {
            "default": create_key(services.sessions, settings.default_tenant, "admin")[0],
            "all eight": create_key(services.sessions, ALL_ENTITIES_TENANT, "admin")[0],
        }
        sentences = list(labelled_sentences(per_entity, seed))
        removed: dict[str, Counter[str]] = {name: Counter() for name in keys}
        with serve_in_thread(settings, services) as base_url, httpx.Client(timeout=60) as http:
            for name, key in keys.items():
                for row, text, value in sentences:
                    response = http.post(
                        f"{base_url}/v1/guardrails/check",
                        json={"text": text},
                        headers={"authorization": f"Bearer {key}"},
                    )
                    response.raise_for_status()
                    body = response.json()
                    # A blocked text reaches no model at all.
                    gone = body["decision"] == "block" or value not in (body["text"] or "")
                    removed[name][row.label] += gone
    return _table(removed, sentences_per_row(per_entity, seed), seed)


def sentences_per_row(per_entity: int, seed: int) -> dict[str, int]:
    counts: Counter[str] = Counter(row.label for row, _, _ in labelled_sentences(per_entity, seed))
    return dict(counts)


def _table(removed: dict[str, Counter[str]], totals: dict[str, int], seed: int) -> list[str]:
    lines = [
        "### PII through the check endpoint",
        "",
        "The synthetic sentences above (seed "
        f"{seed}) sent one by one to `POST /v1/guardrails/check` on the live app (uvicorn, "
        "real policy loading, admin key). A value counts as removed when it is absent from "
        "the returned model text. `default`: policies/default.yaml as shipped; `all eight`: "
        "the same with PERSON and LOCATION added to the input entities.",
        "",
        "| entity | values | removed, default | removed, all eight |",
        "| --- | ---: | ---: | ---: |",
    ]
    for label, total in totals.items():
        cells = " | ".join(ratio(removed[name][label], total) for name in removed)
        lines.append(f"| {label} | {total} | {cells} |")
    return [*lines, ""]
