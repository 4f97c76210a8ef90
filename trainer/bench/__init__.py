"""Benchmarks: like-for-like strategy comparisons, ablations, sampler timings and closed-form forward
counts.
"""
