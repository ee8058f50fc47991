"""Results: what the lab reads out of runs to answer a campaign's question. A run's metrics and
its one diagnosis of failure modes (``logs``), each run's held-out headline (``headline``), the
statistics verdicts rest on (``stats``), the family comparison tables (``compare``), the alerts
that watch a run (``divergence``, ``overoptimisation``) or gate a pipeline stage (``gates``), the
curves (``plots``), and the campaign's answer with its interval (``answer``, ``gold_vs_kl``,
``best_of_n``, ``campaign_answer``, ``campaign_runs``, ``portable_campaign``). Torch-free."""
