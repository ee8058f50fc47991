"""On-policy distillation (GKD): the student samples, a frozen teacher scores every token."""
