"""The end of a distributed run (nsa.training.distributed.shutdown): the process group's backend is gone before the
rank's process exits, for FSDP2 as for DDP.

FSDP2's DeviceMesh holds the process group and torch's DTensor caches keep the mesh until the interpreter exits;
before shutdown released it, the gloo backend's threads (two workers, a socket loop) and its connections outlived
destroy_process_group and were torn down only by the process's exit, concurrently with the other rank's exit (in that
teardown an FSDP rank of a loaded CI run aborted with "terminate called without an active exception", its run
completed). Each rank here lists its threads once nsa-train's main() has returned, before the interpreter exits.
(DDP's backend already went with the trainer, when main() returned: no torch cache holds DDP's process group.)
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from train_utils import REPO, TINY, clean_env, finish, free_port

GLOO_THREADS = ("pt_gloo_runloop", "gloo_tcp_loop")  # ProcessGroupGloo's workers, gloo's TCP event loop

# nsa-train's main(), then this rank's thread names (from /proc: the native threads too) into OUT/threads_rank{r}.json
DRIVER = r"""
import json, os, sys
from pathlib import Path
from nsa.training import cli
code = cli.main(sys.argv[1:])
names = sorted(Path(f"/proc/self/task/{t}/comm").read_text().strip() for t in os.listdir("/proc/self/task"))
out = Path(sys.argv[sys.argv.index("--out-dir") + 1])
(out / f"threads_rank{os.environ['RANK']}.json").write_text(json.dumps(names))
sys.exit(code)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads thread names from /proc (Linux only)")
def test_fsdp2_ends_its_process_group_backend_before_the_process_ends(tmp_path):
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    out = tmp_path / "out"
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master-port={free_port()}",
            str(driver), "--config", str(TINY), "--out-dir", str(out), "--fsdp", "--steps", "2", "--batch-size", "2",
            "--seq-len", "64", "--save-every", "1000"]
    proc = subprocess.Popen(argv, cwd=REPO, env=clean_env({"NSA_TB_DISABLE": "1"}), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    code, log = finish(proc, timeout=300)
    assert code == 0, log[-3000:]
    assert json.loads((out / "status.json").read_text())["status"] == "completed"
    for rank in (0, 1):
        names = json.loads((out / f"threads_rank{rank}.json").read_text())
        left = [n for n in names if n in GLOO_THREADS]
        assert not left, f"rank {rank}: the gloo backend outlived shutdown (threads {names})"
