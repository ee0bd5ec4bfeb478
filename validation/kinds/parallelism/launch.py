"""The launches of the `parallelism` step (validation.kinds.parallelism): one trainer launch per strategy and repeat,
and the batch-size search's probes (validation.kinds.parallelism.analysis.search_batches). Not a step kind (the
leading underscore keeps the registry from treating it as one); it imports neither of those modules.
"""

from __future__ import annotations

from validation.kinds.trainer import trainer_launch

# The trainer flags of each strategy; None removes a flag the runbook's defaults set (--ddp 1 and --fsdp exclude
# each other).
STRATEGY_ARGS = {"ddp": {"ddp": 1, "fsdp": None, "fsdp_no_reshard": None},
                 "fsdp": {"ddp": None, "fsdp": True, "fsdp_no_reshard": None},
                 "fsdp_no_reshard": {"ddp": None, "fsdp": None, "fsdp_no_reshard": True}}


def strategy_launch(step, label: str, repeat: int, winners, run_dir, *, batch: int | None = None,
                    steps_override: int | None = None):
    """The trainer launch of strategy `label` (repeat `repeat`), or of a batch-search probe at micro-batch `batch`."""
    spec = step.strategies[label]
    args = {**STRATEGY_ARGS[spec.strategy], **spec.args}
    if step.profile_steps and batch is None:
        args["profile_steps"] = step.profile_steps
    if batch is not None:
        args.update(batch_size=batch, steps=steps_override)
        rel = f"{step.name}/search_{label}_b{batch}"
    else:
        rel = f"{step.name}/{label}" + (f"_r{repeat + 1}" if step.repeats > 1 else "")
    params = {"strategy": spec.strategy, **{f"args.{k}": v for k, v in spec.args.items()},
              **{f"env.{k}": v for k, v in spec.env.items()}}
    if batch is not None:
        params["args.batch_size"] = batch
    return trainer_launch(step, step.launch, label if batch is None else f"{label}@b{batch}", rel, winners, run_dir,
                          extra_args=args, extra_env=spec.env, params=params, repeat=repeat)
