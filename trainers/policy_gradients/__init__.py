"""Policy-gradient family: REINFORCE, RLOO, PPO, GRPO, Dr. GRPO, GSPO, CISPO, SAPO, DAPO, MaxRL."""
