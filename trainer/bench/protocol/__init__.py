"""The protocol benchmark: the paper's claims tested like for like (``treerpo bench protocol``, ``bench
report``, ``bench sampler`` and ``treerpo nfe``). Every recipe as published, at its own swept rate, on
equal images and equal seconds over paired seeds; the paper's parts switched off one at a time; the
figures and verdicts rendered from ``protocol.json`` alone, so a page is rebuilt without training."""
