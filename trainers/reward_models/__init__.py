"""Reward models: Bradley–Terry preference RM, outcome RM (ORM) and process RM (PRM).

One trainer (``python -m trainers.reward_models.train``) for the three kinds; ``model.py`` holds
the backbone + linear head and its save/load, ``scoring.py`` the batched scorer used by other
families (rejection sampling). Importing this package imports neither torch nor transformers.
"""
