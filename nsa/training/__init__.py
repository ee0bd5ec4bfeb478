"""The NSA trainer (`nsa-train`, `python -m nsa.training`): single process, DDP or FSDP2 under torchrun.

    cli.py         command line, config resolution, exit codes (__main__.py: `python -m nsa.training`)
    flags.py       the command-line flags, read from the config dataclasses (no torch: also nsa-validate's check)
    trainer.py     the training loop (model, wrapping, steps, evaluation, checkpoints, profiler)
    graphs.py      the whole train step in CUDA graphs (train.cuda_graphs)
    config.py      run configs (model / train / data sections) read from YAML and validated key by key
    data.py        build_source: the token source of a dataset; source.py the TokenSource interface; the sources
                   synthetic.py (seeded, generated on the fly), corpus.py (local text files, byte tokenizer),
                   fineweb.py (FineWeb-Edu streamed from the hub)
    optim.py       AdamW and the learning-rate schedule
    distributed.py process-group setup, DDP/FSDP2 wrapping, per-node records
    checkpoint.py  save / load / resume
    outputs.py     the files a run writes for the orchestrator (training.csv, env.json, status.json, ...)
    heartbeat.py   per-rank heartbeat files; watchdog.py reads them to find stalls (`nsa-train watchdog`)
    safety.py      stop signals, .HALT, stack dumps, NSA_FAULT injection; model_faults.py the model faults
                   NSA_FAULT installs for the triage tests
    metrics.py     memory, device peaks (FLOP/s for MFU; exp/s and bytes/s for the roofline), MFU; the torch
                   profiler (train.profile_steps)
    summary.py     the Training Summary (summary.json and the printed block)
    timeline.py    start-up milestones (timeline.json)
    comm_count.py  communication counted at the collective calls (DDP comm hook, FSDP2 collective wrappers)
    comm_model.py  byte and memory models per strategy, from the real parameter list

Importing this package imports no torch: the orchestrator reads the configs and output contracts from here.
"""

from nsa.training import timeline as _timeline  # noqa: E402,F401 - its import time is the fallback process start
