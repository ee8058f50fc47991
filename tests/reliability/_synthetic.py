"""A finished direct-alignment run folder written by hand, shaped as the launcher (run.json) and
a trainer (config.yaml, metrics.jsonl, train.log, progress.json, summary.json, exit.json) leave
it: the lab only reads files, so its bookkeeping can be tested without training anything."""

from __future__ import annotations

import json
from pathlib import Path

from tests._helpers.run_folders import CREATED_AT, write_ending, write_jsonl, write_run_json

DEFAULT_CONFIG = "algorithm: dpo\nmodel:\n  name: tiny\nseed: 42\n"


def finished_run(
    run_dir: Path,
    *,
    state: str = "succeeded",
    steps: int = 4,
    config_text: str = DEFAULT_CONFIG,
) -> Path:
    """Write ``run_dir`` (``<root>/experiments/<campaign>/runs/<run-id>``). ``state`` died leaves
    no summary.json and no exit.json, as a SIGKILL does. Rows: one train and one eval per step,
    ``loss`` 0.7/step, ``accuracy`` 0.5 + 0.05·step, ``eval/accuracy`` 0.5."""
    ended = "2026-01-01T00:01:00.000+00:00"
    write_run_json(
        run_dir, "direct_alignment", "dpo", state=state, created_at=CREATED_AT, ended_at=ended
    )
    (run_dir / "config.yaml").write_text(config_text)
    rows = []
    for step in range(1, steps + 1):
        train = {"step": step, "time_s": step * 0.5, "phase": "train", "loss": 0.7 / step}
        rows.append({**train, "accuracy": 0.5 + 0.05 * step})
        rows.append({"step": step, "time_s": step * 0.5, "phase": "eval", "eval/accuracy": 0.5})
    write_jsonl(run_dir / "metrics.jsonl", rows)
    (run_dir / "samples.jsonl").write_text("")
    (run_dir / "train.log").write_text(
        "".join(f"step {s}/{steps} loss 0.5\n" for s in range(1, steps + 1))
    )
    (run_dir / "progress.json").write_text(json.dumps({"step": steps, "total_steps": steps}))
    outcome = {"succeeded": "succeeded", "died": None}.get(state, state)
    if outcome:
        write_ending(run_dir, outcome, steps=steps, wall_time_s=1.0)
    return run_dir
