"""validation: the nsa-validate orchestrator (runbooks, launchers, metrics, acceptance, reports).

    cli.py         the commands (plan, run, report, compare, list, kinds): parse, call one function, print
    run.py         one run end to end: run_runbook(RunRequest) -> RunOutcome; prepare (also `run --dry-run`)
    report/        reports and comparisons, rendered from results.json alone
    execution/     the runner, acceptance criteria, evidence
    runbook/       reading a runbook: model, schema, expressions; loader, includes, overrides, plan
    kinds/         one package per step kind, and the registry
    launch/        launching and watching processes (torchrun, Slurm, agents, telemetry, this machine's environment)
    analysis/      statistics, significance, metrics, triage, parallelism, attribution, collectives, ...
    results/       results.json: typed records, codec, store, reuse
    contracts.py   the readers of the trainer's small files; formatting.py every figure's format; version.py the
                   version and the source digest

Layers and who may import whom: docs/architecture.md.
"""
