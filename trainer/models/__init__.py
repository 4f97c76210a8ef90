"""Implementations of the :class:`trainer.policy.Policy` protocol."""
