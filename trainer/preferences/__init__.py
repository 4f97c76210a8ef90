"""A person's picks as data: picks folders of stored trees and the choices made on them.

``records``: the versioned format (docs/picks.md). ``store``: a folder on disk, written append-only
and atomically. ``identity``: which model and LoRA sampled a tree. ``pairs``: the preference pairs
picks imply (for the personal reward). Imports nothing above ``core`` and ``utils``.
"""
