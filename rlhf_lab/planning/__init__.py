"""Planning: what a run will cost and how it is sized before it starts. Modules here answer
questions asked before launch — how long a run takes on this machine (``time``, from the
throughput calibration the trainers measure and ``throughput_cache`` keeps), and, beside them,
the shrink and difficulty-calibration rules as they move in — from a resolved config, without
importing torch: measurements run in trainer subprocesses and come back as JSON."""
