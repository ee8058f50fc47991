"""How many tokens after the prompt one policy-gradient sequence can hold, read from a config
dict. Torch-free.

A single-turn run holds one completion: ``rollout.max_new_tokens``. A multi-turn run
(``env.name`` set, issue #28) holds a trajectory: model turns of up to ``rollout.max_new_tokens``
each and the tool replies between them (``env.max_observation_tokens`` of content plus the chat
template's text around it), up to ``env.max_turns`` turns, or ``env.max_total_tokens`` when set.
The replies are context the model attends to (and holds in its KV cache) though they carry loss
mask 0, so the memory, time and shrink rules size sequences by this length, the one the
trainer's ``PolicyGradientConfig.max_completion_tokens`` gives; this module computes it the same
way from the resolved config the lab works on (:class:`~rlhf_lab.planning.trainer_config.TrainerConfig`:
the trainer's defaults for the ``env`` keys it leaves out, and its bound on the chat template's
text around a reply).
"""

from __future__ import annotations

from typing import Any

from rlhf_lab.planning.trainer_config import TrainerConfig

__all__ = ["completion_tokens", "env_value", "is_multi_turn", "trajectory_bound"]


def is_multi_turn(config: TrainerConfig) -> bool:
    """Whether the config's rollouts are trajectories with an environment (``env.name`` set)."""
    return config.get("env.name") is not None


def env_value(key: str, value: Any) -> int:
    """``value`` of ``env.<key>``, or the trainer's default for that key when it is None."""
    from trainers.policy_gradients.config import EnvSection

    return int(EnvSection.model_fields[key].default if value is None else value)


def trajectory_bound(turns: int, per_turn: int, observation: int) -> int:
    """A trajectory's most tokens after the prompt: ``turns × (per_turn + observation +
    wrapper)``, the wrapper being the trainer's bound on the chat template's text around a tool
    reply (``REPLY_WRAPPER_TOKENS``)."""
    from trainers.policy_gradients.config import REPLY_WRAPPER_TOKENS

    return turns * (per_turn + observation + REPLY_WRAPPER_TOKENS)


def _config_bound(config: TrainerConfig, per_turn: int) -> int:
    turns = env_value("max_turns", config.get("env.max_turns"))
    observation = env_value("max_observation_tokens", config.get("env.max_observation_tokens"))
    return trajectory_bound(turns, per_turn, observation)


def completion_tokens(
    config: TrainerConfig, per_turn: int | None = None, default_new_tokens: int = 512
) -> int:
    """The most tokens after the prompt one sequence of the config holds.

    ``per_turn``: the new tokens of one model turn (None: ``rollout.max_new_tokens``, else
    ``default_new_tokens``); held-out evaluation passes its own ``eval.max_new_tokens``. Single
    turn: ``per_turn``. Multi-turn: ``env.max_total_tokens`` when set, else
    :func:`trajectory_bound` of the rollout's turn budget, and at most
    :func:`trajectory_bound` with ``per_turn`` (the trainer bounds every trajectory, held-out ones
    included, by the rollout's total). The trainer's ``max_completion_tokens`` for the rollout;
    less only where ``env.max_total_tokens`` is more than ``max_turns`` turns can fill."""
    rollout_new = int(config.get("rollout.max_new_tokens") or default_new_tokens)
    turn = rollout_new if per_turn is None else int(per_turn)
    if not is_multi_turn(config):
        return turn
    total = config.get("env.max_total_tokens")
    cap = int(total) if total is not None else _config_bound(config, rollout_new)
    return min(cap, _config_bound(config, turn))
