"""The analyses the kinds and reports share: statistics and significance (stats, significance/), metrics from a
trainer's outputs (metrics, metric_names), triage, parallelism, attribution, collectives (and the comm step's
programs: comm_bench, nccl_tests), interference and plausibility (every metric's physical range).
"""
