"""A fresh `bastion serve` (new data folder: migrations, first key, sample corpus) turns
ready, and idles within issue 20's memory goal. How fast is measured by bench/cold_start.py,
not asserted here (the machine's load moves it); the test reports it."""

from __future__ import annotations

import json

from engine.cpu_info import cpu_has_bf16
from tests.support.cold_start import this_checkout_cold_start

# 1.5 GB. Without native bf16 the engine keeps float32 prefill weights, about 270 MiB more.
IDLE_RSS_GOAL_MIB = 1.5e9 / 2**20


def test_fresh_serve_turns_ready() -> None:
    start = this_checkout_cold_start()
    print(
        f"cold start: ready in {start.seconds_to_ready:.1f} s, idle RSS {start.idle_rss_mb:.0f} MiB"
    )
    events = [json.loads(line)["event"] for line in start.stderr_lines]
    # Every part loaded, the sample corpus was ingested on this first start.
    assert "gateway.services_ready" in events
    assert "sample_corpus.ingested" in events
    stages = {
        record["stage"]
        for record in map(json.loads, start.stderr_lines)
        if record["event"] == "gateway.stage_loaded"
    }
    assert stages >= {"engine", "pii_analyzer", "embedder", "sample_corpus", "policies"}
    assert start.idle_rss_mb > 0
    if cpu_has_bf16():
        assert start.idle_rss_mb <= IDLE_RSS_GOAL_MIB
