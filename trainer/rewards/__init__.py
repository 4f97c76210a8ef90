"""Reward functions used to score generated images during RL fine-tuning."""
