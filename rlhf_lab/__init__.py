"""rlhf-lab: plan, launch, watch and record small RLHF experiments. Never imports torch at
import time; trainers run as separate processes."""

__version__ = "0.1.0"
