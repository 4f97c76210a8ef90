"""The taste wing of the benchmarks: how much of a person's taste training learns from picks, with a
simulated person who labels trees for a hidden taste, against an oracle frontier.

- the run (``treerpo bench taste``): ``budget`` (what a run spends), ``trees`` (the trees the person
  labels), ``method`` (the personal reward trained under the guard), ``frontier`` (the oracle ceiling),
  ``measure`` (the test figures and the grid), ``run`` (a seed and a taste), ``storage`` (``taste.json``
  and a stopped seed's pieces);
- the tastes and the person: ``hidden_tastes`` (the taste functions), ``person`` (the simulated person);
- the figures: ``summary`` (``taste.json``'s figures), ``ablation`` (arms paired with the default, and
  where the rest goes), ``page`` and ``readme`` (the results page and the short blocks), ``combine`` and
  ``assemble`` (the default that chooses the weight, from runs at fixed weights);
- the studies beside the table: ``weight_arm``, ``default_check``, ``levers``, ``guard_steps``, and
  ``picking`` (``treerpo bench picking``: how many clicks the reward needs);
- ``commands``: their command lines under ``treerpo bench``.
"""
