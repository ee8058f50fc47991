"""Rejection sampling: generate N completions per prompt, score them (a verifier or a trained
reward model), select (four strategies: two reward-selected, two matched random controls), SFT on
the selection, evaluate held-out exact match. Importing this package imports neither torch nor
transformers."""
