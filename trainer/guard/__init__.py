"""The guard: a limit, set by the person, on how much prompt-following training may trade for taste.

A run from picks trains toward the personal reward while a guard reward (the scene reward on the
embedded model, PickScore or CLIP on FLUX and SD3) measures prompt-following. Every few iterations
the guard keeps a checkpoint of the LoRA and measures both on validation prompt/seed pairs that
training never sees; after training it takes the checkpoint (and LoRA strength) with the most taste
whose guard fall stays within the limit, and the person can take another one without training again.

- :mod:`.levels`: the limit in plain words (strictly / closely / loosely) and its scale per guard;
- :mod:`.trail`: the measured points of a run (taste and guard per checkpoint and strength);
- :mod:`.choice`: which point the limit allows, and why (pure);
- :mod:`.tracker`: a run's checkpoints measured on validation pairs, and the choice among them
  (the training layer drives it: `trainer/training/guarded.py`);
- :mod:`.figures`: the trade plot.
- :mod:`.terms`: the reward spec split into the taste term and the guard terms.
"""
