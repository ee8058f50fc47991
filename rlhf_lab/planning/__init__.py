"""Planning a run before it starts: what the lab decides from facts it measures or derives
rather than from the recipe alone — the difficulty calibration of runs that learn from their own
samples (a probe of the base model's pass rate on candidate tasks: ``calibration``,
``calibration_apply``, ``candidates``), the predicted wall time on this machine (``time``, from
the throughput the trainers measure, kept by ``throughput_cache``), and the glue that sizes a
pretrained model's run (``real_model``). Torch-free, as the rest of the lab: anything that needs
the model runs in a trainer-side subprocess and comes back as JSON."""
