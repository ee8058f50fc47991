"""Planning a run before it starts: what the lab decides from facts it measures or derives
rather than from the recipe alone — the difficulty calibration of runs that learn from their own
samples (a probe of the base model's pass rate on candidate tasks: ``calibration``,
``calibration_apply``, ``candidates``), the predicted wall time on this machine (``time``, from
the throughput the trainers measure, kept by ``throughput_cache``), the shrink's rules for a
pretrained model (``real_model``: LoRA by default on a CPU, checkpointing only when the memory
estimate needs it, sizes a 2-core CPU finishes; ``offline_data``: what data a config can read
on this machine). Torch-free, as the rest of the lab: anything that needs the model runs in a
trainer-side subprocess and comes back as JSON."""
