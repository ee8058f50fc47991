"""Multi-turn environments and the tools a model may call in them (calculator, Python sandbox)."""
