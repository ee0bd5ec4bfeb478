"""What an end-to-end run of a suite runbook may end with on a shared machine: GO, or INCOMPLETE (exit 3) where
every required criterion that did not pass is inconclusive and names the disturbance that made it so (the run's
evidence lists the disturbed steps and the command that runs them again). Anything else (a failure, a criterion
left inconclusive without a disturbance) fails the test, on a quiet machine as on a busy one."""

from __future__ import annotations


def assert_go_or_disturbed(proc, results: dict) -> str:
    """The verdict, once checked (see the module docstring); `proc` is the CompletedProcess of `nsa-validate run`."""
    tail = proc.stdout[-3000:] + proc.stderr[-3000:]
    word, reason = results["verdict"], results["verdict_reason"]
    if word == "GO":
        assert proc.returncode == 0, tail
        return word
    assert word == "INCOMPLETE" and proc.returncode == 3, (word, reason, tail)
    evidence = results.get("evidence") or {}
    disturbed = {d["step"] for d in evidence.get("disturbed") or []}
    assert disturbed and evidence.get("rerun"), (reason, evidence)
    open_ = [c for c in results["acceptance"] if c["severity"] == "fail" and c["status"] != "pass"]
    assert open_, reason
    for c in open_:
        assert c["status"] == "inconclusive", (c, reason)
        assert "was disturbed: " in c["detail"] and "run again: nsa-validate run " in c["detail"], c
    assert "inconclusive" in reason and "run again: " in reason, reason
    return word
