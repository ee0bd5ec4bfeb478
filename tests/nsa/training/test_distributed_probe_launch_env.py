"""The trainer's launch environment and process group (nsa.training.distributed): LOCAL_WORLD_SIZE and MASTER_PORT
that name no rank or port are refused before a process group starts, naming the variable; on two real gloo ranks
(forked from this process, each with torchrun's variables) the sum over ranks is the hand-computed one, the process
group carries train.pg_timeout_s, and a barrier one rank never reaches fails on the other at that timeout."""

from __future__ import annotations

import datetime
import multiprocessing
import os
import re
import socket
import sys
import time

import pytest
import torch.distributed as dist

from nsa.training import distributed

LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
               "GROUP_RANK", "TORCHELASTIC_USE_AGENT_STORE")


@pytest.fixture()
def launch_env(monkeypatch):
    """A clean launch environment; the test sets what it needs."""
    for name in LAUNCH_VARS:
        monkeypatch.delenv(name, raising=False)

    def put(**env):
        for name, value in env.items():
            monkeypatch.setenv(name, value)
    return put


# ---------------------------------------------------------------------- refused before a process group starts
@pytest.mark.parametrize("env, needle", [
    ({"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "1"}, "LOCAL_RANK=1 is outside this node's local ranks 0 to 0"),
    ({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2"},
     "LOCAL_RANK=2 is outside this node's local ranks 0 to 1 (LOCAL_WORLD_SIZE=2)"),
    ({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "3"},
     "LOCAL_WORLD_SIZE=3: the number of ranks on this node must be from 1 to WORLD_SIZE=2"),
    ({"LOCAL_WORLD_SIZE": "0"}, "LOCAL_WORLD_SIZE=0: the number of ranks on this node must be from 1 to WORLD_SIZE=1"),
    ({"LOCAL_WORLD_SIZE": "two"}, "LOCAL_WORLD_SIZE='two' is not an integer"),
], ids=["local_rank_past_local_world", "local_rank_equals_local_world", "local_world_past_world", "local_world_0",
        "local_world_text"])
def test_a_local_rank_outside_its_node_is_refused_naming_the_variable(launch_env, env, needle):
    launch_env(**env)  # no MASTER_ADDR: refused before a process group would need it
    with pytest.raises(distributed.LaunchError, match=re.escape(needle)):
        distributed.init("cpu", 1.0)
    assert not dist.is_initialized()


@pytest.mark.parametrize("port, needle", [
    ("abc", "MASTER_PORT='abc' is not an integer"),
    ("0", "MASTER_PORT='0' is not a TCP port from 1 to 65535"),
    ("65536", "MASTER_PORT='65536' is not a TCP port from 1 to 65535"),
    ("-1", "MASTER_PORT='-1' is not a TCP port from 1 to 65535"),
], ids=["text", "zero", "past_65535", "negative"])
def test_a_master_port_that_is_no_port_is_refused_naming_the_variable(launch_env, port, needle):
    """Rank 1 of 2: "abc" failed in the rendezvous with int()'s message ("invalid literal for int() with base 10"),
    port 0 had rank 1 wait out the process-group timeout for a connection to port 0 (every rank of a real launch
    did, 600 s by default) and then fail with a socket timeout."""
    launch_env(RANK="1", WORLD_SIZE="2", LOCAL_RANK="1", LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=port)
    with pytest.raises(distributed.LaunchError, match=re.escape(needle)):
        distributed.init("cpu", 1.0)
    assert not dist.is_initialized()


def test_every_rank_of_a_multi_node_launch_is_accepted():
    for world, per_node in ((1, 1), (2, 2), (4, 2), (8, 4), (3, 3)):
        for rank in range(world):
            distributed.check_launch(rank, world, rank % per_node, per_node)
    for port in ("1", "29500", "65535", " 29500"):
        distributed.check_master_port(port)
    distributed.check_master_port(None)  # unset: the rendezvous names it


def test_a_single_process_ignores_master_port(launch_env):
    launch_env(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", MASTER_PORT="0")
    info = distributed.init("cpu", 1.0)
    assert (info.rank, info.world_size, info.backend, info.device.type) == (0, 1, None, "cpu")
    assert not dist.is_initialized()


# ---------------------------------------------------------------------- two real gloo ranks
PG_TIMEOUT_S = {"sum": 7.25, "barrier": 1.0}  # train.pg_timeout_s of each two-rank run


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, port: int, what: str, conn) -> None:
    """One rank (a forked child): torchrun's variables, distributed.init, `what`, shutdown; its findings to `conn`."""
    code = 0
    try:
        os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2",
                          MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        info = distributed.init("cpu", PG_TIMEOUT_S[what])
        found: dict = {"info": (info.rank, info.world_size, info.local_rank, info.backend, info.device.type)}
        try:
            if what == "sum":
                found["sum"] = distributed.all_reduce_sum([1.5 + rank, 10.0 ** rank, -rank, 0.1, 1e16 * (1 - rank),
                                                           float(rank)], info)
                group = dist.distributed_c10d._get_default_group()
                found["timeout"] = group._get_backend(info.device).options._timeout.total_seconds()
            elif what == "barrier":
                if rank == 0:
                    try:
                        distributed.barrier(info)
                        found["barrier"] = "passed"
                    except RuntimeError as exc:
                        found["barrier"] = f"failed: {exc}"
                else:
                    time.sleep(PG_TIMEOUT_S[what] + 0.6)  # never reaches the barrier while rank 0 waits
        finally:
            distributed.shutdown(synchronize=False)
        found["initialized_after_shutdown"] = dist.is_initialized()
        conn.send(found)
    except BaseException as exc:  # noqa: BLE001 - reported to the test
        conn.send({"error": f"{type(exc).__name__}: {exc}"})
        code = 1
    finally:
        conn.close()
        os._exit(code)


def _two_ranks(what: str) -> list[dict]:
    ctx = multiprocessing.get_context("fork")
    port = _free_port()
    pipes, procs = [], []
    try:
        for rank in (0, 1):
            parent, child = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=_rank_main, args=(rank, port, what, child), daemon=True)
            proc.start()
            child.close()
            pipes.append(parent)
            procs.append(proc)
        found = []
        for parent in pipes:
            assert parent.poll(60), "a rank did not report within 60 s"
            found.append(parent.recv())
        for proc in procs:
            proc.join(30)
        return found
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
                proc.join(5)


pytestmark_linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forks two gloo ranks")


@pytestmark_linux
def test_two_gloo_ranks_sum_known_values_and_carry_the_timeout():
    r0, r1 = _two_ranks("sum")
    assert "error" not in r0 and "error" not in r1, (r0, r1)
    assert r0["info"] == (0, 2, 0, "gloo", "cpu") and r1["info"] == (1, 2, 1, "gloo", "cpu")
    # by hand: rank 0 gives [1.5, 1, 0, 0.1, 1e16, 0], rank 1 [2.5, 10, -1, 0.1, 0, 1]; float64 keeps 1e16 + 0 exact
    expected = [4.0, 11.0, -1.0, 0.2, 1e16, 1.0]
    assert r0["sum"] == expected and r1["sum"] == expected
    assert r0["timeout"] == r1["timeout"] == datetime.timedelta(seconds=7.25).total_seconds()
    assert not r0["initialized_after_shutdown"] and not r1["initialized_after_shutdown"]


@pytestmark_linux
def test_a_barrier_one_rank_never_reaches_fails_on_the_other():
    r0, r1 = _two_ranks("barrier")
    assert "error" not in r0 and "error" not in r1, (r0, r1)
    assert r0["barrier"].startswith("failed: ") and "timed out" in r0["barrier"].lower(), r0  # not the peer leaving
    assert not r0["initialized_after_shutdown"] and not r1["initialized_after_shutdown"]
