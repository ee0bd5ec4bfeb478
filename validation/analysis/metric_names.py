"""The names of a training.csv summary's metrics (validation.analysis.metrics.summarize), apart from the code that computes
them: the step kinds declare the metric names they produce from these (validation.kinds.trainer), and `plan` checks
criteria against them without loading pandas."""

# Columns summarized per window, in report order. Every one is a training.csv column (nsa.training.outputs).
METRIC_COLUMNS = ("toks_per_s", "step_time_s", "loss", "grad_norm", "mem_alloc_gb", "mem_reserved_gb", "mfu")
# Per-step rates of work that is the same in every step of a run (a step's tokens, its FLOPs): a window's figure of
# each (its summary "mean") is the window's work over its time, the harmonic mean of the per-step rates, never their
# plain mean, which counts a slow step as much as a fast one (a step that stalls 10x lowers it by a fifth of what
# it costs the run). Their stdev, cv, median, min and max are those of the per-step rates.
RATE_COLUMNS = ("toks_per_s", "mfu")
# The rates among the figures a window or a run gives (a sweep's or A/B's metric, a comparison's): the columns above
# and the summary's per-GPU and per-node tokens/s (the window's tokens/s over a fixed world size or node count), whose
# runs' figure is likewise their work over their time.
RATE_METRICS = RATE_COLUMNS + ("toks_per_s_per_gpu", "toks_per_s_per_node")
# Statistics computed for each metric column over the window (stdev is the population stdev, statistics.pstdev).
STAT_NAMES = ("mean", "median", "stdev", "cv", "min", "max", "n")
# Summary keys derived from several columns or rows (documented in summarize()); always present in a summary.
DERIVED_KEYS = ("toks_per_s_per_gpu", "first_loss", "final_loss", "loss_drop", "mem_peak_gb", "mem_plateau",
                "throughput_stable", "throughput_drift")
# throughput_stable (validation.analysis.metrics.summarize): the CV of toks_per_s over the window is at most this
THROUGHPUT_CV_MAX = 0.15
