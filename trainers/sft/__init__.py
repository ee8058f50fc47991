"""Supervised fine-tuning: masked cross-entropy on assistant turns (instruction tuning, and the
warm start that gives a tiny model reward contrast for policy-gradient runs)."""
