"""The math of Dynamic-TreeRPO and its baselines: pure functions over tensors (flow steps, tree
rollout, plans, advantages, losses). Imports nothing else of the trainer.
"""
