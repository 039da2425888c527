"""A fresh `bastion serve` (new data folder: migrations, first key, sample corpus) turns
ready. How fast is measured by bench/cold_start.py, not asserted here; the test reports it."""

from __future__ import annotations

import json

from tests.support.cold_start import this_checkout_cold_start


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
