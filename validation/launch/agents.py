"""Run several torchrun agents on this machine as the nodes of one multi-node job (``launcher: torchrun`` with
``nnodes > 1``): ``python -m validation.launch.agents AGENTS.json``, the command ``local_agents_argv`` writes
AGENTS.json for.

AGENTS.json: ``{"agents": [{"name": "node0", "argv": [...], "env": {...}}, ...], "grace_s": 30}``; each agent's
environment is this process's plus its ``env``. Every agent shares this process's stdout/stderr (the launcher's
log) and session, so the launcher's process tracking and signals reach them all. When one agent fails, the others
get ``grace_s`` to end by themselves (they usually fail in their next collective or rendezvous) and are then
terminated. SIGTERM / SIGINT / SIGHUP are passed on to every agent, also to one being started when the signal came;
once one came, no further agent is started. This process is the subreaper of its agents'
processes (PR_SET_CHILD_SUBREAPER): a rank whose agent died is re-parented to it, and before it exits it ends
whatever is still running below it (validation.launch.processes.end_descendants), so no rank outlives the job,
also when nsa-validate itself was killed (this process then gets SIGTERM: its parent-death signal). Every failing
agent is named in the log with its exit code. Exit code: the first failing agent's (a signal N as 128 + N; of
agents seen failed in the same poll, one killed by a signal), else 128 + N when signal N stopped the job before all
its agents were started, else 0.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from nsa.training.outputs import write_json
from validation.launch.processes import become_subreaper, die_with_parent, end_descendants, signals_deferred
from validation.launch.spec import LaunchSpec, safe_name
from validation.launch.torchrun import agent_commands

POLL_S = 0.2
STOP_GRACE_S = 15.0  # after a SIGTERM/SIGINT/SIGHUP passed on, the agents that are still there are killed
AGENTS_JSON = "agents.json"
AGENTS_GRACE_S = 30.0  # a local agent failed: the others get this long to end by themselves


def local_agents_argv(spec: LaunchSpec, port: int, step_dir: Path, ranks_dir: Path) -> list[str]:
    """The command that runs agent_commands together (validation.launch.agents), once AGENTS.json is written."""
    rdzv_id = f"nsav-{safe_name(step_dir.name)[:40]}-{uuid.uuid4().hex[:8]}"
    agents = agent_commands(spec, port, ranks_dir, rdzv_id)
    path = step_dir / AGENTS_JSON
    write_json(path, {"agents": agents, "grace_s": AGENTS_GRACE_S})
    return [sys.executable, "-m", "validation.launch.agents", str(path)]



def _load(path: Path) -> tuple[list[dict], float]:
    spec = json.loads(path.read_text())
    agents = spec.get("agents")
    if not isinstance(agents, list) or not agents:
        raise ValueError(f"{path}: 'agents' must be a non-empty list")
    for i, agent in enumerate(agents):
        argv, env = agent.get("argv"), agent.get("env", {})
        if not (isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv)):
            raise ValueError(f"{path}: agents[{i}].argv must be a non-empty list of strings")
        if not (isinstance(env, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())):
            raise ValueError(f"{path}: agents[{i}].env must map strings to strings")
    grace = spec.get("grace_s", 30.0)
    if isinstance(grace, bool) or not isinstance(grace, (int, float)) or grace < 0:
        raise ValueError(f"{path}: grace_s must be a number >= 0")
    return agents, float(grace)


def _code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def run(agents: list[dict], grace_s: float) -> int:
    procs: list[subprocess.Popen] = []
    stop_requested: list[float] = []
    stop_signals: list[int] = []  # the signal that asked for the stop

    def forward(signum, _frame):
        if _frame is not None and not stop_requested:
            stop_requested.append(time.monotonic())
            stop_signals.append(signum)
        for p in procs:
            if p.poll() is None:
                try:
                    p.send_signal(signum)
                except ProcessLookupError:
                    pass

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    become_subreaper()
    for agent in agents:
        # a signal while an agent starts is passed on once the agent is in procs (it reaches this agent too)
        with signals_deferred():
            if stop_requested:  # a signal came in while the agents were being started: start no more of them
                print(f"[agents] stopping: {agent.get('name', '?')} and the agents after it are not started",
                      file=sys.stderr, flush=True)
                break
            print(f"[agents] starting {agent.get('name', '?')}: {' '.join(agent['argv'])}", file=sys.stderr,
                  flush=True)
            procs.append(subprocess.Popen(agent["argv"], env={**os.environ, **agent.get("env", {})},
                                          stdin=subprocess.DEVNULL,
                                          # SIGKILL when this supervisor dies; the ranks then get their own SIGTERM
                                          preexec_fn=functools.partial(die_with_parent, signal.SIGKILL, os.getpid())))
    first_failure: tuple[str, int] | None = None
    failed_at = None
    told: set[int] = set()  # the agents whose failure the log names

    def failures() -> None:
        """Name in the log every agent seen failed since the last poll; the first of them is the job's failure.
        Several seen in one poll (a node's agent killed, and another failing at once because its peer went): one
        killed by a signal goes first, the others' failures are usually its consequence."""
        nonlocal first_failure, failed_at
        seen = sorted((i for i, p in enumerate(procs) if p.returncode not in (None, 0) and i not in told),
                      key=lambda i: (procs[i].returncode >= 0, i))
        for i in seen:
            told.add(i)
            code = procs[i].returncode
            how = f" (killed by {_signal_name(-code)})" if code < 0 else ""
            print(f"[agents] {agents[i].get('name', '?')} exited with {code}{how}", file=sys.stderr, flush=True)
        if seen and first_failure is None:
            first_failure, failed_at = (agents[seen[0]].get("name", "?"), procs[seen[0]].returncode), time.monotonic()
            if any(p.poll() is None for p in procs):
                print(f"[agents] the others get {grace_s:g}s to end", file=sys.stderr, flush=True)

    while any(p.poll() is None for p in procs):
        failures()
        if stop_requested and time.monotonic() - stop_requested[0] > STOP_GRACE_S:
            for p in procs:  # a torchrun agent that did not end on SIGTERM: its ranks get their own SIGTERM
                if p.poll() is None:
                    p.kill()
            break
        if failed_at is not None and time.monotonic() - failed_at > grace_s:
            print("[agents] terminating the remaining agents", file=sys.stderr, flush=True)
            forward(signal.SIGTERM, None)
            end = time.monotonic() + 10.0
            while any(p.poll() is None for p in procs) and time.monotonic() < end:
                time.sleep(POLL_S)
            for p in procs:
                if p.poll() is None:
                    p.kill()
            break
        time.sleep(POLL_S)
    for p in procs:
        p.wait()
    failures()  # also those that ended after the last poll: all of them in one poll, say
    left = end_descendants(grace_s=5.0)
    if left:
        print(f"[agents] ended {len(left)} process(es) the agents left behind: {left}", file=sys.stderr, flush=True)
    if first_failure is None and len(procs) < len(agents):  # stopped before the whole job was started
        return 128 + stop_signals[0]
    return 0 if first_failure is None else _code(first_failure[1])


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m validation.launch.agents AGENTS.json", file=sys.stderr)
        return 2
    try:
        agents, grace = _load(Path(args[0]))
    except (OSError, ValueError) as exc:
        print(f"validation.launch.agents: {exc}", file=sys.stderr)
        return 2
    return run(agents, grace)


if __name__ == "__main__":
    sys.exit(main())
