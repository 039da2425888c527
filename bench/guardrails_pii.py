"""PII part of the guardrails benchmark (`bench/guardrails.py` runs it): recall and
precision per entity on synthetic sentences generated with Faker (seeded)."""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Callable

import numpy as np
from confusion import Counts, ratio
from faker import Faker

from guardrails import PiiConfig, PiiRedactor, build_analyzer

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


def bench_pii(embed: Callable[[list[str]], np.ndarray], per_entity: int = 30) -> list[str]:
    del embed  # presidio only
    random.seed(7)
    Faker.seed(7)
    fake, fake_eu = Faker("en_US"), Faker(["de_DE", "fr_FR", "en_GB", "nl_NL", "es_ES"])
    entities = list(TEMPLATES)
    redactor = PiiRedactor(build_analyzer(), PiiConfig(entities=entities))
    found: dict[str, Counts] = defaultdict(Counts)
    misses: dict[str, list[str]] = defaultdict(list)
    for entity in entities:
        for i in range(per_entity):
            value = _values(fake, fake_eu, entity)
            template = TEMPLATES[entity][i % len(TEMPLATES[entity])]
            text = template.format(value)
            start = text.index(value)
            truth = (start, start + len(value))
            predictions = redactor.analyze(text)
            hit = any(
                f.entity_type == entity and f.start < truth[1] and f.end > truth[0]
                for f in predictions
            )
            found[entity].add(1, hit)
            if not hit:
                misses[entity].append(value)
            for f in predictions:
                overlaps_truth = f.start < truth[1] and f.end > truth[0]
                if f.entity_type != entity or not overlaps_truth:
                    found[f.entity_type].fp += 1
    lines = [
        "### PII (synthetic sentences)",
        "",
        f"{per_entity} Faker-generated sentences per entity type (seeded; IBANs from DE, FR, "
        "GB, NL, ES), all eight entity types enabled at score threshold 0.4. A hit is a "
        "finding of the right type overlapping the value; any other finding is a false "
        "positive of its type.",
        "",
        "| entity | values | precision | recall | example misses |",
        "| --- | ---: | ---: | ---: | --- |",
    ]
    for entity in entities:
        c = found[entity]
        missed = ", ".join(f"`{m}`" for m in misses[entity][:3])
        lines.append(
            f"| {entity} | {c.tp + c.fn} | {ratio(c.tp, c.tp + c.fp)} | "
            f"{ratio(c.tp, c.tp + c.fn)} | {missed} |"
        )
    return [*lines, ""]
