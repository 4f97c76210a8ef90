"""The headless training run: the loop, evaluation, checkpoints, logs and data-parallel helpers."""
