"""The NSA trainer (`nsa-train`, `python -m nsa.training`): single process, DDP or FSDP2 under torchrun.

    cli.py         command line, config resolution, exit codes
    trainer.py     the training loop (model, wrapping, steps, evaluation, checkpoints, profiler)
    config.py      run configs (model / train / data sections) read from YAML and validated key by key
    data.py        token sources (synthetic, local text files, FineWeb-Edu)
    optim.py       AdamW and the learning-rate schedule
    distributed.py process-group setup, DDP/FSDP2 wrapping, per-node records
    checkpoint.py  save / load / resume
    outputs.py     the files a run writes for the orchestrator (training.csv, env.json, status.json, ...)
    heartbeat.py   per-rank heartbeat files; watchdog.py reads them to find stalls
    safety.py      stop signals, .HALT, stack dumps, NSA_FAULT injection
    metrics.py     tokens/s, memory, MFU

Importing this package imports no torch: the orchestrator reads the configs and output contracts from here.
"""
