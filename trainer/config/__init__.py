"""The training configuration: its dataclasses with documented defaults, and YAML reading and writing."""
