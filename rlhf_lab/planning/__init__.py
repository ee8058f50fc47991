"""Planning: everything the lab decides before a run starts. The catalog of families and their
shipped recipes (``catalog``, ``families``, ``config_models``), a config as the trainer will see
it (``configs``; overrides as typed pairs, ``overrides``; the resolved config as one read-only
view, ``trainer_config``) and the checks its own model cannot make (``validation``), the shrink to a quick
sanity run (``shrink``; for a pretrained model ``real_model`` and ``offline_data``), the models
this machine has or can pull (``models``), the difficulty calibration of runs that learn from
their own samples (``calibration``, ``calibration_apply``, ``candidates``), the predicted wall
time (``time`` with ``time_models`` and ``time_formulas``, from the throughput the trainers
measure, kept by ``throughput_cache``; a slow step announces itself through ``notices``), and the
plan that ties them together for a request such as "small SimPO sanity check" (``plan``). The
memory estimate has its own package, :mod:`rlhf_lab.planning.memory`. Torch-free, as the whole lab:
anything that needs the model runs in a trainer-side subprocess and comes back as JSON."""
