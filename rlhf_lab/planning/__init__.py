"""Planning a run before it starts: what the lab decides from facts it measures or derives
rather than from the recipe alone — the shrink of a recipe into a run that fits the model and
the machine, the difficulty calibration of runs that learn from their own samples (a probe of
the base model's pass rate on candidate tasks, :mod:`rlhf_lab.planning.calibration`), and the
predicted wall time. Torch-free, as the rest of the lab: anything that needs the model runs in a
trainer-side subprocess."""
