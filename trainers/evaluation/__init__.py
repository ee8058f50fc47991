"""Evaluation of trained models: suites, statistics and the job (``python -m trainers.evaluation.run``)."""
