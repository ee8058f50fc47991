"""A stand-in verifier for learning tests on a random or barely trained tiny model, where the
real tasks' rewards are almost always 0: correctness = the share of vowel characters in the
completion text, a dense signal any sampler can climb. Same signature and result keys as
``trainers.core.verifier.compute_rewards``: a test passes it as the trainer's verifier
(``pg_train.main.with_options(verifier=vowel_share_rewards)``)."""

from __future__ import annotations

import torch


def vowel_share_rewards(texts, metas, lengths, *, format_weight=0.5, penalty=None):
    """correctness = total = the share of vowels; binary = share > 0.5; no format or penalty."""
    share = torch.tensor([sum(c in "aeiou" for c in t) / max(1, len(t)) for t in texts])
    zeros = torch.zeros(len(texts))
    return {
        "correctness": share,
        "format": zeros,
        "penalty": zeros,
        "binary": (share > 0.5).float(),
        "total": share,
    }
