"""Planning a run before it starts: what data a config can read on this machine, and the shrink's
rules for a pretrained model (LoRA by default on a CPU, gradient checkpointing only when the
memory estimate needs it, sizes a 2-core CPU finishes). Torch-free: the facts come from config
files and caches on disk, never from loading a model. ``rlhf_lab.shrink`` applies these rules;
the lab's checks (:mod:`rlhf_lab.validation`) use the data-file check.
"""
