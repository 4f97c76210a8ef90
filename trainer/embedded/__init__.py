"""Small self-contained datasets that need no downloads (procedural scenes)."""
