"""Evaluation as lab jobs: what an evaluation checks before it starts and how it launches like a
run (``jobs``), what it costs in memory and tokens before it runs (``cost``), its numbers as the
ledger shows them (``records``) and its table in ``compare`` (``compare``). The suites themselves
run trainer-side in :mod:`trainers.evaluation`. Torch-free."""
