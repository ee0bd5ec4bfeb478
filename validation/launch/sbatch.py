"""The Slurm batch script of one launch (``batch_script``) and the allocation it asks for (``SlurmOptions``, with
the check of a runbook's extra ``#SBATCH`` lines): text only, the same at plan time (``nsa-validate plan``, through
``LaunchSpec.batch_script``) and in the job validation.launch.slurm submits. It imports neither of those modules.

The script: ``#SBATCH`` lines for the allocation (nodes, one task per node, GPUs per node, CPUs per task, partition,
account, time limit, the runbook's extra lines), the job's output appended to the step's ``stdout.log``, then
``srun`` starting one torchrun agent per node; the agents meet by c10d rendezvous on the first node of the allocation
(its NodeAddr, as Slurm knows it) at a port derived from the job id (``rdzv_port_expr``). Every value is quoted
(``shlex.quote``), so runbook text never becomes shell code.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from validation.contracts import TELEMETRY_CSV
from validation.launch.torchrun import NODE_NAME_VAR, PREFIX_TEMPLATE_VAR, RANK_PREFIX_TEMPLATE, torchrun_argv

RDZV_PORT_BASE = 29500  # the rendezvous port: RDZV_PORT_BASE + job id % RDZV_PORT_SPAN
RDZV_PORT_SPAN = 20000
# --tasks-per-node: sbatch's other name for --ntasks-per-node
_SBATCH_OWN = ("--nodes", "--ntasks", "--ntasks-per-node", "--tasks-per-node", "--output", "--error", "--open-mode",
               "--chdir", "--job-name", "--requeue", "--no-requeue", "--parsable", "--wait")
# options the runbook's launcher keys write, which the rest of the launch also reads (srun's --cpus-per-task in the
# script, the GPU check before a step runs): option -> (the launcher key, its shortest abbreviation sbatch takes:
# --cpus-per- is --cpus-per-gpu or --cpus-per-task, --gpus-per- four options)
_SBATCH_KEYS = {"--cpus-per-task": ("cpus_per_task", "--cpus-per-t", "the job's srun asks for the key's value"),
                "--gpus-per-node": ("gpus_per_node", "--gpus-per-n", "a step's GPU check reads the key")}
# options that give the job GPUs beside the launcher key gpus_per_node (the job's --gpus-per-node line, and the only
# GPU count a step's GPU check reads), or tasks by its GPUs: option -> (its shortest abbreviation sbatch takes, what
# it sets). --gpus is itself a prefix of --gpus-per-*, so only --gpus is --gpus (an exact name wins); -G, a short
# option, is refused as every line that is not one long option is
_GPUS_BESIDE_KEY = ("beside the launcher key gpus_per_node (which writes the job's --gpus-per-node, and which a step's "
                    "GPU check reads): set gpus_per_node instead")
_ONE_TASK = "where the job runs one task per node (--ntasks-per-node=1, which nsa-validate sets itself)"
_SBATCH_GPU_COUNTS = {
    "--gpus": ("--gpus", f"the job's GPUs in all, spread over its nodes as Slurm finds them, {_GPUS_BESIDE_KEY}"),
    "--gpus-per-task": ("--gpus-per-t", f"GPUs per task, that is per node here, {_GPUS_BESIDE_KEY}"),
    "--gpus-per-socket": ("--gpus-per-s", f"GPUs per socket (per node: times its sockets), {_GPUS_BESIDE_KEY}"),
    "--ntasks-per-gpu": ("--ntasks-per-g", f"tasks per GPU, {_ONE_TASK}"),
    "--ntasks-per-tres": ("--ntasks-per-t", f"tasks per GPU, {_ONE_TASK}")}
# options whose value lists resources, GPUs among them: --gres=gpu:2,nvme:1 (gpu:2 per node), and Slurm 23.11's
# --tres-per-task=cpu=4,gres/gpu=1 (per task: per node here; cpu is what cpus_per_task writes, and the job's srun
# asks for the key's value). option -> its shortest abbreviation: --gres is also a prefix of --gres-flags, and
# --tres-per-task is the only --tr option of 23.11 (a later --tres-bind makes --tres- ambiguous, refused by sbatch)
_SBATCH_RESOURCE_LISTS = {"--gres": "--gres", "--tres-per-task": "--tr"}
# options that bind tasks to GPUs (sbatch hands the binding to the job's srun: SLURM_GPU_BIND): the job's one task per
# node starts all of the node's ranks, so a binding other than none can only hide GPUs from them
_SBATCH_GPU_BINDS = {"--gpu-bind": "--gpu-b", "--tres-bind": "--tres-b"}
# GRES names that put GPUs in the job: gpu, and the shares of one (mps, shard)
_GPU_GRES = ("gpu", "mps", "shard")
_SBATCH_BLANKS = " \t\v\f"  # where sbatch splits an #SBATCH line into words (C's isspace, less the newlines)
_ENV_KEY_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class SlurmOptions:
    """The allocation of one step's job (runbook ``launcher:`` keys of the same names)."""

    partition: str | None = None
    account: str | None = None
    time_limit: str | None = None  # Slurm's format: "MM", "HH:MM:SS", "D-HH:MM"
    gpus_per_node: int = 0
    cpus_per_task: int | None = None
    sbatch: tuple[str, ...] = ()  # extra "#SBATCH ..." option lines, e.g. "--exclusive", "--qos=high"


def sbatch_words(line: str) -> list[str] | None:
    """The arguments sbatch reads from the text of an #SBATCH line: words split at blanks, '...' and "..." quote
    (and are removed), an unquoted # ends the line; None when a quote is left open (sbatch stops there). A backslash
    (sbatch drops it and takes the next character as it is) is not read here: validate_sbatch_line refuses it."""
    words, word, quote, started = [], [], None, False
    for ch in line:
        if quote is not None:
            if ch == quote:
                quote = None
            else:
                word.append(ch)
        elif ch in "'\"":
            quote, started = ch, True
        elif ch in _SBATCH_BLANKS:
            if started:
                words.append("".join(word))
            word, started = [], False
        elif ch == "#":
            break
        else:
            word.append(ch)
            started = True
    if quote is not None:
        return None
    if started:
        words.append("".join(word))
    return words


def validate_sbatch_line(line: str) -> str | None:
    """None when `line` is acceptable as an extra #SBATCH option, else why not. sbatch reads every word of the line
    as an argument (``--exclusive --nodes=4`` sets --nodes too) and removes quotes and backslashes first
    (``--no"des"=4`` is --nodes=4): the option is named as sbatch reads it, and a line is one option, with its value
    in the same word (``--qos=high``) or the next (``--qos high``)."""
    one = "must be one long option such as --exclusive or --qos=high (no newline)"
    if not isinstance(line, str) or "\n" in line or "\r" in line:
        return one
    if "\\" in line:
        return "contains a backslash, which sbatch removes (taking the next character as it is)"
    words = sbatch_words(line)
    if words is None:
        return "has a quote that is not closed"
    if (not words or not words[0].startswith("--") or len(words) > 2
            or (len(words) == 2 and ("=" in words[0] or words[1].startswith("-")))):
        return f"{one}; sbatch reads it as {words!r}"
    name = words[0].split("=", 1)[0]
    if name in _SBATCH_OWN:
        return f"{name} is set by nsa-validate itself"
    # sbatch takes any unambiguous abbreviation of a long option (getopt_long): --outp=... is --output=...
    own = [o for o in _SBATCH_OWN if o.startswith(name)]
    if own:
        return f"{name} abbreviates {' or '.join(own)}, which nsa-validate sets itself"
    for option, (key, shortest, reader) in _SBATCH_KEYS.items():
        # sbatch takes an option's last value: the line would override the key's own #SBATCH line (or, the key unset,
        # give the job an allocation the launch does not know of)
        if name.startswith(shortest) and option.startswith(name):
            return f"{name} sets {option}, which the launcher key {key} writes ({reader}): set {key} instead"
    value = words[0].split("=", 1)[1] if "=" in words[0] else words[1] if len(words) == 2 else None
    for option, (shortest, what) in _SBATCH_GPU_COUNTS.items():
        if name.startswith(shortest) and option.startswith(name):
            return f"{name} sets {option}: {what}"
    for option, shortest in _SBATCH_RESOURCE_LISTS.items():
        if name.startswith(shortest) and option.startswith(name) and value is not None:
            named = name if name == option else f"{name} ({option})"
            kinds = resource_kinds(value)
            if "gpu" in kinds:
                return f"{named} asks for GPUs ({value}) {_GPUS_BESIDE_KEY}"
            if "cpu" in kinds:
                return (f"{named} asks for CPUs per task ({value}), which the launcher key cpus_per_task writes (the "
                        "job's srun asks for the key's value): set cpus_per_task instead")
    for option, shortest in _SBATCH_GPU_BINDS.items():
        if name.startswith(shortest) and option.startswith(name) and value is not None:
            binding = value.lower()
            if option == "--tres-bind":  # gres/gpu:<a --gpu-bind value>, + between resources; others pass
                found = re.search(r"gres[/:]gpu:([^+;]*)", binding)
                if found is None:
                    continue
                binding = found.group(1)
            if any(t.strip() not in ("none", "verbose") for t in binding.split(",")):
                named = name if name == option else f"{name} ({option})"
                return (f"{named} binds each task to some of the node's GPUs ({value}), {_ONE_TASK}, which starts "
                        "all of the node's ranks: it would hide GPUs from them (a binding of none is accepted)")
    if len(name) > 3 and "--array".startswith(name):  # --arr, --array=0-3: one job per index, each the whole step
        return (f"{name} makes an array job: every index would run the whole step into the same directory "
                "(one step is one job)")
    if len(name) > 3 and "--clusters".startswith(name):  # --clusters, --cluster (-M)
        return (f"{name} sends the job to another cluster, where nsa-validate's squeue and scancel do not look: it "
                "would be neither followed nor cancelled")
    return None


def resource_kinds(value: str) -> set[str]:
    """The kinds of resource a --gres / --tres-per-task list asks for: "gpu" for a GPU or a share of one (gpu, mps,
    shard GRES, with or without a type and count, as gres:NAME or gres/NAME too, the count after : or =), "cpu" for
    CPUs, else the GRES's own name (``gpu:a100:2,nvme:1`` -> {"gpu", "nvme"}); names are read without regard to
    case."""
    kinds = set()
    for item in value.split(","):
        item = item.strip().lower()
        if item.startswith(("gres:", "gres/")):
            item = item[5:]
        name = re.split(r"[:=/]", item, maxsplit=1)[0]
        if name:
            kinds.add("gpu" if name in _GPU_GRES else name)
    return kinds


def sbatch_path_problem(path: str) -> str | None:
    """None when `path` can be given in an #SBATCH line, else why not: a newline ends the line (and sbatch then stops
    reading #SBATCH lines at the next one, so --no-requeue, --chdir, ... would be lost), and sbatch drops a backslash
    there (and slurmd once more in --output)."""
    if "\n" in path or "\r" in path:
        return "contains a newline, which an #SBATCH line cannot hold"
    if "\\" in path:
        return "contains a backslash, which Slurm removes from #SBATCH paths"
    return None


def rdzv_port_expr() -> str:
    """The bash expression of the rendezvous port inside the job (distinct for concurrent jobs)."""
    return f"$(( {RDZV_PORT_BASE} + SLURM_JOB_ID % {RDZV_PORT_SPAN} ))"


def batch_script(*, job_name: str, nnodes: int, nproc_per_node: int, argv: list[str], env: dict[str, str],
                 cwd: Path, log_path: Path, ranks_dir: Path, options: SlurmOptions, python: str,
                 torchrun: bool = True, telemetry_s: float | None = None, telemetry_dir: Path | None = None,
                 cores: float | None = None) -> str:
    """The bash batch script of one launch. `argv` is the command without torchrun (``python -m nsa.training ...``);
    with `torchrun`, each node's task runs ``python -m torch.distributed.run`` with c10d rendezvous, else `argv`
    itself runs once per node. `env` is exported in the script (values quoted). With `telemetry_s` (torchrun only),
    every node's task first starts its device telemetry sampler in the background (``python -m
    validation.launch.telemetry``, writing `telemetry_dir`/telemetry-<node>.csv, ending with the task) and ends it
    after the agent; `cores`: the cores the task uses on its node (the sampler's --cores)."""
    for line in options.sbatch:
        problem = validate_sbatch_line(line)
        if problem:
            raise ValueError(f"sbatch line {line!r}: {problem}")
    bad = [k for k in env if not _ENV_KEY_RE.fullmatch(k)]
    if bad:
        raise ValueError(f"environment variable names must match {_ENV_KEY_RE.pattern}: {bad}")
    for what, path in (("output", log_path), ("working directory", cwd)):
        problem = sbatch_path_problem(str(path))
        if problem:
            raise ValueError(f"the job's {what} {str(path)!r} {problem}")
    # the other #SBATCH values: a newline would end the line (its rest then runs as bash, and sbatch stops reading
    # #SBATCH lines there), and sbatch drops a backslash even inside quotes
    for what, value in (("name", job_name), ("partition", options.partition), ("account", options.account),
                        ("time limit", options.time_limit)):
        if value is not None and any(c in str(value) for c in "\n\r\\"):
            raise ValueError(f"the job's {what} {str(value)!r} contains a newline or a backslash, which an #SBATCH "
                             "line cannot hold")
    q = shlex.quote
    lines = ["#!/bin/bash",
             f"#SBATCH --job-name={q(job_name)}",
             f"#SBATCH --nodes={int(nnodes)}",
             "#SBATCH --ntasks-per-node=1",
             # Slurm expands %j, %N, ... in --output; %% is a literal %
             f"#SBATCH --output={q(str(log_path).replace('%', '%%'))}",
             "#SBATCH --open-mode=append",
             "#SBATCH --no-requeue",  # a validation job is never silently rerun: its failure is the finding
             f"#SBATCH --chdir={q(str(cwd))}"]
    if options.gpus_per_node:
        lines.append(f"#SBATCH --gpus-per-node={int(options.gpus_per_node)}")
    if options.cpus_per_task:
        lines.append(f"#SBATCH --cpus-per-task={int(options.cpus_per_task)}")
    for key, flag in (("partition", "--partition"), ("account", "--account"), ("time_limit", "--time")):
        value = getattr(options, key)
        if value:
            lines.append(f"#SBATCH {flag}={q(str(value))}")
    lines += [f"#SBATCH {line}" for line in options.sbatch]
    lines += ["set -euo pipefail"]
    lines += [f"export {k}={q(v)}" for k, v in sorted(env.items())]
    # srun no longer takes the job's --cpus-per-task from the allocation (Slurm 22.05 and later): without it each
    # task would get one CPU (one core for every rank of the node where CPUs are bound)
    task = "--ntasks-per-node=1" + (f" --cpus-per-task={int(options.cpus_per_task)}" if options.cpus_per_task else "")
    if not torchrun:  # a test suite or benchmark: once, on the job's node
        lines += ["# generated by nsa-validate: the step's command on the allocated node",
                  f"srun {task} \\", "    " + " \\\n    ".join(_chunks([q(a) for a in argv]))]
        return "\n".join(lines) + "\n"
    lines += ["# generated by nsa-validate: one torchrun agent per node, c10d rendezvous on the first node",
              f"export {PREFIX_TEMPLATE_VAR}={q(RANK_PREFIX_TEMPLATE)}",
              f"export NSAV_RANKS_DIR={q(str(ranks_dir))}",
              'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
              "head_addr=$(scontrol show node \"$head_node\" -o | sed -n 's/.*NodeAddr=\\([^ ]*\\).*/\\1/p')",
              'head_addr=${head_addr:-$head_node}',
              # torchrun reads any option from PET_<OPTION>: the rendezvous is only known inside the job
              f'export PET_RDZV_ENDPOINT="$head_addr:{rdzv_port_expr()}"',
              'export PET_RDZV_ID="nsav-$SLURM_JOB_ID"',
              'echo "[slurm] job $SLURM_JOB_ID on $SLURM_JOB_NODELIST; rendezvous at $PET_RDZV_ENDPOINT"']
    # the command under torchrun as a local launch puts it (torchrun_argv): `python -m mod` and `python script.py`
    # run as torchrun's module / script, anything else (`python -c ...`, a wrapper) with --no-python
    command = torchrun_argv(argv, [python, "-m", "torch.distributed.run", f"--nnodes={int(nnodes)}",
                                   f"--nproc-per-node={int(nproc_per_node)}", "--rdzv-backend=c10d", "--redirects", "3",
                                   "--tee", "3"])
    # each task names its node for the trainer and its own torchrun log directory, says whether it hosts the
    # rendezvous store (the first node: torch's own guess compares host names, which fails when NodeAddr is
    # another interface's address), then runs the agent; --kill-on-bad-exit: srun ends the other nodes' tasks
    # when one fails
    lines.append('export NSAV_HEAD_NODE="$head_node"')
    run = 'exec "$@"'
    if telemetry_s:  # the node's sampler: started before the agent, ended after it (and by itself without its root)
        lines.append(f"export NSAV_TELEMETRY_DIR={q(str(telemetry_dir if telemetry_dir is not None else cwd))} "
                     f"NSAV_PYTHON={q(python)}")
        stem = TELEMETRY_CSV.rsplit(".", 1)[0]
        run = (f'"$NSAV_PYTHON" -m validation.launch.telemetry --root $$ --interval {float(telemetry_s):g} '
               + (f'--cores {float(cores):g} ' if cores else "")
               + f'--node "$SLURMD_NODENAME" --out "$NSAV_TELEMETRY_DIR/{stem}-$SLURMD_NODENAME.csv" & nsav_tel=$!; '
               '"$@"; rc=$?; kill -TERM $nsav_tel 2>/dev/null; wait $nsav_tel; exit $rc')
    lines.append(f"srun --kill-on-bad-exit=1 {task} bash -c "
                 f"'export {NODE_NAME_VAR}=\"$SLURMD_NODENAME\" PET_LOG_DIR=\"$NSAV_RANKS_DIR/$SLURMD_NODENAME\"; "
                 'if [ "$SLURMD_NODENAME" = "$NSAV_HEAD_NODE" ]; then export PET_RDZV_CONF=is_host=1; '
                 "else export PET_RDZV_CONF=is_host=0; fi; "
                 f"{run}' nsav-task \\")
    lines.append("    " + " \\\n    ".join(_chunks([q(c) for c in command])))
    return "\n".join(lines) + "\n"


def _chunks(words: list[str], width: int = 100) -> list[str]:
    out, cur = [], ""
    for w in words:
        if cur and len(cur) + 1 + len(w) > width:
            out.append(cur)
            cur = w
        else:
            cur = f"{cur} {w}" if cur else w
    if cur:
        out.append(cur)
    return out
