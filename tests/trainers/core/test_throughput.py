"""The throughput calibration (trainers/core/throughput.py) on tiny, for real: the JSON the lab
caches and predicts from. No timing is asserted, only that every figure is there and sane."""

from __future__ import annotations

import json

import pytest

from trainers.core import throughput
from trainers.core.models import model_fingerprint


def test_linear_fit_through_two_points():
    fit = throughput.linear_fit([(100, 0.3), (500, 0.7)])
    assert fit["tokens_per_s"] == pytest.approx(1000.0)
    assert fit["fixed_s"] == pytest.approx(0.2)
    # a point below the line would need a negative fixed part: none, the rate from the big one
    flat = throughput.linear_fit([(100, 0.05), (500, 1.0)])
    assert flat["fixed_s"] == 0.0 and flat["tokens_per_s"] == pytest.approx(500.0)


@pytest.mark.slow
def test_calibration_json_on_tiny(capsys):
    argv = ["--model", "tiny", "--threads", "1", "--json", "--min-time", "0.01", "--max-reps", "1"]
    assert throughput.main(argv) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1, out  # the JSON alone on stdout (peft's line goes to stderr)
    data = json.loads(out[0])
    assert data["format_version"] == throughput.FORMAT_VERSION
    assert data["model"] == "tiny" and data["fingerprint"] == model_fingerprint("tiny")
    assert data["device"] == "cpu" and data["threads"] == 1 and data["params"] > 0
    for part in ("import_s", "load_s", "reload_s", "save_s"):
        assert data["startup"][part] >= 0
    for section in ("train", "lora", "forward"):
        assert data[section]["tokens_per_s"] > 0 and data[section]["fixed_s"] >= 0
        assert [p["tokens"] for p in data[section]["points"]] == [32, 512]
    assert data["lora"]["trainable_params"] < data["train"]["trainable_params"]
    assert data["train"]["optimizer_s"] > 0 and data["lora"]["optimizer_s"] > 0
    rows = data["decode"]["rows"]
    assert [r["rows"] for r in rows] == list(throughput.DECODE_ROWS)
    assert all(r["step_s"] > 0 and r["tokens_per_s"] > 0 for r in rows)
    assert data["decode"]["prefill_tokens_per_s"] > 0
    assert data["head"]["train_tokens_per_s"] > 0 and data["head"]["forward_tokens_per_s"] > 0
    lengths = data["lengths"]
    assert set(lengths) == {"demonstration", "prompt", "chosen", "rejected"}
    # a demonstration holds a prompt and its answer: longer than the prompt alone
    assert lengths["demonstration"]["p90"] > lengths["prompt"]["mean"] > 0
    assert lengths["chosen"]["p90"] >= lengths["chosen"]["mean"] > 0
