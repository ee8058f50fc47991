"""A difficulty probe answered from a table (no model, no subprocess), for the calibration a
shrunk policy-gradient launch runs: ``using(CalibrationPolicy(probe=StubProbe(RATES), ...))``."""

from __future__ import annotations


class StubProbe:
    """Answers a probe from a table of pass rates by candidate id; counts its calls."""

    def __init__(self, rates: dict[str, tuple[float, float, int]]):
        self.rates, self.calls = rates, []

    def __call__(self, model, candidates, settings):
        self.calls.append([c.id for c in candidates])
        rows = []
        for c in candidates:
            p, contrast, p90 = self.rates.get(c.id, (0.0, 0.0, 30))
            rows.append(
                {
                    "id": c.id,
                    "specs": c.specs,
                    "prompts": settings.prompts,
                    "samples": settings.samples,
                    "pass_rate": p,
                    "contrast": contrast,
                    "length_p90": p90,
                    "clipped": 0.0,
                }  # fmt: skip
            )
        return {"model": model, "seconds": 1.0, "candidates": rows}


RATES = {"letter_counting/1-3-words": (0.3, 0.5, 40), "chain_sum/2x1-digit": (0.8, 0.3, 20)}
"""Pass rate, contrast and p90 length by candidate: letter counting is in the pass range."""
