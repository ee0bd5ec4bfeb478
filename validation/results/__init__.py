"""A run's results: the results.json model (model), the whole run as typed records (run; the records of
trainer_launch, interference and decision) and the codec between them and JSON (codec), reading and writing it in a
run directory (store), and finding a previous run's phase to reuse (reuse).
"""
