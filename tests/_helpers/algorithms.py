"""The algorithms each family ships, written out once for the tests that pin them (the family's
registry and the lab's recipe list must both name every one)."""

DIRECT_ALIGNMENT_LOSSES = frozenset(
    {"dpo", "cdpo", "dpo_norm", "ipo", "simpo", "orpo", "kto", "apo_zero", "apo_down"}
)
