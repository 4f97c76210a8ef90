"""Small helpers with no trainer dependency: atomic file writes."""
