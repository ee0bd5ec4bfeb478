"""A run's results: the results.json model, reading and writing it in a run directory (store), and finding a previous
run's phase to reuse (reuse).
"""
