"""Commands that use a trained LoRA: sample images, and score image files with the rewards."""
