"""PII part of the guardrails benchmark (`bench/guardrails.py` runs it): recall and
precision per entity on synthetic sentences generated with Faker (seeded)."""

from __future__ import annotations

import random
import statistics
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from confusion import Counts, ratio
from faker import Faker

from guardrails import PiiConfig, PiiRedactor, build_analyzer
from guardrails.config import DEFAULT_PII_ENTITIES
from retrieval import smart_format

TEMPLATES: dict[str, list[str]] = {
    "EMAIL_ADDRESS": [
        "Please send the contract to {} by Friday.",
        "my email is {}",
        "Contact: {} (sales)",
    ],
    "PHONE_NUMBER": ["Call me at {} after lunch.", "Phone: {}", "You can reach the desk on {}."],
    "CREDIT_CARD": [
        "Charge it to card {} please.",
        "My credit card number is {}.",
        "Card {} was declined.",
    ],
    "IBAN_CODE": ["Transfer the deposit to IBAN {}.", "Our account: {}", "Pay to {} today."],
    "US_SSN": ["My SSN is {}.", "social security number {} on file", "SSN: {}"],
    "IP_ADDRESS": ["The server at {} is down.", "Blocked requests from {}.", "ping {}"],
    "PERSON": ["I spoke with {} yesterday.", "{} will join the call.", "Ask {} for the keys."],
    "LOCATION": ["We are opening an office in {}.", "She moved to {} last year.", "Ship to {}."],
}
# Names and places that are not English, drawn from these Faker locales (cities and
# countries as the locale writes them), in the same English templates.
WORLD_LOCALES = ["de_DE", "fr_FR", "es_ES", "it_IT", "nl_NL", "pt_PT", "pl_PL", "tr_TR"]
WORLD = "world"
# Phrasings the context recognizer (guardrails/pii_context.py) was not written against,
# with the same non-English values: how far its cue phrases generalise.
OTHER_PHRASING = "world, other phrasing"
OTHER_TEMPLATES: dict[str, list[str]] = {
    "PERSON": [
        "My manager is {}.",
        "Can {} sign the purchase order?",
        "Invite {} to the kickoff.",
        "The ticket is assigned to {}.",
        "{} has left the company.",
        "Lunch with {} is at one.",
        "Was the offer accepted by {}?",
        "Please cc {} on the thread.",
        "Our contact there is {}.",
    ],
    "LOCATION": [
        "The meeting will be held at our site in {}.",
        "Prices are higher in {}.",
        "He commutes to {} every day.",
        "The shipment left {} this morning.",
        "Our supplier is based out of {}.",
        "Welcome to {}!",
        "I am currently in {} for a workshop.",
        "Demand from {} doubled.",
        "The plant near {} closed.",
    ],
}


@dataclass(frozen=True, slots=True)
class Row:
    """One row of the table: an entity, and where its values come from."""

    entity: str
    group: str = "en"

    @property
    def label(self) -> str:
        return self.entity if self.group == "en" else f"{self.entity} ({self.group})"


def _values(fake: Faker, fake_eu: Faker, entity: str) -> str:
    if entity == "EMAIL_ADDRESS":
        return str(fake.email())
    if entity == "PHONE_NUMBER":
        return str(fake.phone_number())
    if entity == "CREDIT_CARD":
        card = random.choice(["visa16", "mastercard", "amex", "discover"])
        return str(fake.credit_card_number(card_type=card))
    if entity == "IBAN_CODE":
        return str(fake_eu.iban())
    if entity == "US_SSN":
        return str(fake.ssn())
    if entity == "IP_ADDRESS":
        return str(fake.ipv4() if random.random() < 0.7 else fake.ipv6())
    if entity == "PERSON":
        return str(fake.name())
    return str(random.choice([fake.city(), fake.country(), fake.state()]))


def _world_value(fakes: list[Faker], entity: str) -> str:
    fake = random.choice(fakes)
    if entity == "PERSON":
        return str(fake.name())
    return str(fake.city() if random.random() < 0.7 else fake.country())


def labelled_sentences(per_entity: int = 30, seed: int = 7) -> Iterator[tuple[Row, str, str]]:
    """(row, sentence, value) for every synthetic sentence, English rows first (their
    draws do not depend on the rows added after them)."""
    random.seed(seed)
    Faker.seed(seed)
    fake, fake_eu = Faker("en_US"), Faker(["de_DE", "fr_FR", "en_GB", "nl_NL", "es_ES"])
    for entity in TEMPLATES:
        for i in range(per_entity):
            value = _values(fake, fake_eu, entity)
            yield Row(entity), TEMPLATES[entity][i % len(TEMPLATES[entity])].format(value), value
    fakes = [Faker(locale) for locale in WORLD_LOCALES]
    for i, f in enumerate(fakes):
        f.seed_instance(seed * 100 + i)
    for entity in ("PERSON", "LOCATION"):
        for i in range(per_entity):
            value = _world_value(fakes, entity)
            template = TEMPLATES[entity][i % len(TEMPLATES[entity])]
            yield Row(entity, WORLD), template.format(value), value
    for entity, templates in OTHER_TEMPLATES.items():
        for i in range(per_entity):
            value = _world_value(fakes, entity)
            yield Row(entity, OTHER_PHRASING), templates[i % len(templates)].format(value), value


def bench_pii(
    embed: Callable[[list[str]], np.ndarray] | None, per_entity: int = 30, seed: int = 7
) -> list[str]:
    del embed  # presidio only
    entities = list(TEMPLATES)
    redactor = PiiRedactor(build_analyzer(), PiiConfig(entities=entities))
    rows: list[Row] = []
    found: dict[Row, Counts] = defaultdict(Counts)
    misses: dict[Row, list[str]] = defaultdict(list)
    for row, text, value in labelled_sentences(per_entity, seed):
        if row not in rows:
            rows.append(row)
        start = text.index(value)
        truth = (start, start + len(value))
        predictions = redactor.analyze(text)
        hit = any(
            f.entity_type == row.entity and f.start < truth[1] and f.end > truth[0]
            for f in predictions
        )
        found[row].add(1, hit)
        if not hit:
            misses[row].append(value)
        for f in predictions:
            overlaps_truth = f.start < truth[1] and f.end > truth[0]
            if f.entity_type != row.entity or not overlaps_truth:
                # A false finding counts against its type's row of the same group.
                wrong = Row(f.entity_type, row.group)
                found[wrong if wrong in ALL_ROWS else Row(f.entity_type)].fp += 1
    lines = [
        "### PII (synthetic sentences)",
        "",
        f"{per_entity} Faker-generated sentences per entity type (seed {seed}; IBANs from DE, "
        "FR, GB, NL, ES), all eight entity types enabled at score threshold 0.4. Rows marked "
        f"({WORLD}) take names, cities and countries from the Faker locales "
        f"{', '.join(WORLD_LOCALES)} in the same templates; ({OTHER_PHRASING}) the same kind of "
        "values in other sentences, which the cue phrases of guardrails/pii_context.py were "
        "not written against. A hit is a finding of the right "
        "type overlapping the value; any other finding is a false positive of its type.",
        "",
        "| entity | values | precision | recall | example misses |",
        "| --- | ---: | ---: | ---: | --- |",
    ]
    for row in rows:
        c = found[row]
        missed = ", ".join(f"`{m}`" for m in misses[row][:3])
        lines.append(
            f"| {row.label} | {c.tp + c.fn} | {ratio(c.tp, c.tp + c.fp)} | "
            f"{ratio(c.tp, c.tp + c.fn)} | {missed} |"
        )
    return [*lines, ""]


ALL_ROWS = frozenset(
    [Row(e) for e in TEMPLATES]
    + [Row(e, group) for group in (WORLD, OTHER_PHRASING) for e in OTHER_TEMPLATES]
)


# Harmless business sentences: no personal data, but the capitalised product and team
# names, weekdays, figures, versions and codes that a PII check may take for some.
BUSINESS_TEXTS = [
    "Please move the quarterly review to Thursday at 10:30.",
    "We moved the billing service to Kubernetes last quarter.",
    "Ask Finance for the Q3 budget before the end of March.",
    "The Falcon release will ship on Monday with version 4.12.0.",
    "Upgrade the agent to 2.3.1.7 before enabling the new dashboard.",
    "Our Enterprise plan costs 1,200 EUR per seat per year.",
    "Order 4481-2290 was delivered in 3 boxes of 24 units.",
    "Tickets JIRA-10422 and JIRA-10431 block the Atlas migration.",
    "Salesforce and HubSpot both sync with the CRM every 15 minutes.",
    "The Support Team will join the call on Friday.",
    "Marketing approved the Spring campaign for Northwind Pro.",
    "Customer Success asked for a summary of churn by segment.",
    "Switch the default model to Llama 3 and keep GPT-4o as a fallback.",
    "Thanks, Product Operations, for the quick turnaround.",
    "Our SLA promises 99.95% uptime measured over 30 days.",
    "The invoice total is 18,450.00 USD including 20% VAT.",
    "Run the migration with Postgres 16 and Redis 7.2 on staging.",
    "We are opening a new support queue for Premium customers.",
    "Ship to Production only after the QA sign-off on Wednesday.",
    "Hi Team, the all-hands moves to Tuesday next week.",
    "The Azure bill rose 12 percent after we enabled Defender.",
    "Compare the Basic, Standard and Premium tiers in the table below.",
    "The Helios board approved 3 new hires for Data Platform.",
    "Our NPS went from 41 to 47 between January and June.",
    "The API returns HTTP 429 after 600 requests per minute.",
    "Reset the Okta policy and re-enroll the YubiKey tokens.",
    "Please translate the onboarding guide to French and German.",
    "Version 10.4.2.1 of the firmware fixes the Wi-Fi drop.",
    "Our Gold partners get 15% off the Atlas Suite until December.",
    "The Orion project moved from Jenkins to GitHub Actions.",
    "Call the Helpdesk if the VPN client shows error 809.",
    "Legal will review the NDA template by Friday.",
    "The build 2024.11.3 failed on the ARM64 runners.",
    "Archive the Slack channel #proj-zephyr after the launch.",
    "The Sprint 42 retrospective is on the Confluence page.",
    "Budget line 6100-200 covers travel and training.",
    "Our Dublin Core metadata export now includes ISBN fields.",
    "The Titan cluster runs 48 nodes with 2 TB of RAM each.",
    "Delivery to Warehouse B is scheduled for Saturday morning.",
    "Roll back to Release 7 if the error rate exceeds 2%.",
    "Apple Pay and Google Pay are enabled for the EU storefront.",
    "Contact Procurement about the Dell and Lenovo quotes.",
    "The Phoenix dashboard shows 1,024 active sessions.",
    "Our Android app 5.6.0 is in review at the Play Store.",
    "Forward the report to Accounts Payable for approval.",
    "Set the retention to 90 days for the Audit Log index.",
    "Meeting with Vendor Management moved to 3 pm.",
    "The Sirius router firmware 1.0.0.12 is end-of-life.",
    "Expand to Enterprise tier once the pilot succeeds.",
    "Sales in EMEA grew 8% while APAC stayed flat.",
]
# shared/ sits in the checkout on CI and beside it on a developer's machine.
_CRANFIELD_PATH = "shared/data/retrieval/cranfield/cran.all.1400"
CRANFIELD_CANDIDATES = [p / _CRANFIELD_PATH for p in Path(__file__).resolve().parents[1:3]]
# The configurations compared: the default entities with the former default country,
# with "uk" added (the default now), then each NER entity on top.
PRECISION_CONFIGS: dict[str, tuple[list[str], list[str]]] = {
    "us": (list(DEFAULT_PII_ENTITIES), ["us"]),
    "us + uk (default)": (list(DEFAULT_PII_ENTITIES), ["us", "uk"]),
    "+ PERSON": ([*DEFAULT_PII_ENTITIES, "PERSON"], ["us", "uk"]),
    "+ LOCATION": ([*DEFAULT_PII_ENTITIES, "LOCATION"], ["us", "uk"]),
}


def cranfield_abstracts(limit: int = 1400) -> list[str]:
    """The abstracts (`.W` fields) only: the `.A` fields are authors' names."""
    path = next((p for p in CRANFIELD_CANDIDATES if p.is_file()), None)
    if path is None:
        return []
    return smart_format.texts(path)[:limit]


def _uk_national_numbers(n: int = 30, seed: int = 7) -> list[str]:
    """UK numbers as written at home ("020 7946 0958"), not "+44 ...": what `uk` adds."""
    fake = Faker("en_GB")
    fake.seed_instance(seed)
    numbers: list[str] = []
    while len(numbers) < n:
        number = str(fake.phone_number())
        if number.startswith("0"):
            numbers.append(number)
    return numbers


def bench_pii_precision(cranfield_limit: int = 300) -> list[str]:
    """False findings on harmless text, per entity, for the default and each candidate
    change of the defaults: the figures that chose them (docs/policies.md)."""
    corpora = {"business": BUSINESS_TEXTS, "cranfield": cranfield_abstracts(limit=cranfield_limit)}
    lines = [
        "### PII false findings on harmless text",
        "",
        f"{len(BUSINESS_TEXTS)} business sentences without personal data (capitalised product "
        f"and team names, weekdays, figures, versions) and {len(corpora['cranfield'])} Cranfield "
        "abstracts (lower-case aerodynamics prose, many figures). Every finding is false. "
        "Texts: share of texts with a finding; then findings per entity; p50 ms per text.",
        "",
        "| config | corpus | texts flagged | false findings by entity | p50 ms |",
        "| --- | --- | ---: | --- | ---: |",
    ]
    for name, (entities, countries) in PRECISION_CONFIGS.items():
        redactor = PiiRedactor(build_analyzer(countries), PiiConfig(entities=entities))
        for corpus, texts in corpora.items():
            if not texts:
                continue
            by_entity: Counter[str] = Counter()
            flagged, times = 0, []
            for text in texts:
                t0 = time.perf_counter()
                findings = redactor.analyze(text)
                times.append((time.perf_counter() - t0) * 1000)
                by_entity.update(f.entity_type for f in findings)
                flagged += bool(findings)
            detail = ", ".join(f"{e} {n}" for e, n in by_entity.most_common()) or "none"
            lines.append(
                f"| {name} | {corpus} | {flagged}/{len(texts)} ({flagged / len(texts):.1%}) | "
                f"{detail} | {statistics.median(times):.1f} |"
            )
    uk_numbers = _uk_national_numbers()
    found = []
    for name in ("us", "us + uk (default)"):
        entities, countries = PRECISION_CONFIGS[name]
        redactor = PiiRedactor(build_analyzer(countries), PiiConfig(entities=entities))
        hits = sum(
            any(f.entity_type == "PHONE_NUMBER" for f in redactor.analyze(f"Call me on {n}."))
            for n in uk_numbers
        )
        found.append(f"{name} {hits}/{len(uk_numbers)}")
    lines += ["", f"UK national-format numbers (Faker en_GB) found: {', '.join(found)}."]
    return [*lines, ""]
