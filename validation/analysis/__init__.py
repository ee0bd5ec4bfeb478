"""The analyses the kinds and reports share: statistics and significance, metrics from a trainer's outputs, triage,
parallelism, attribution, collectives and interference.
"""
