"""The sanitizer kind's reading of compute-sanitizer logs as the tool writes them (sanitizer.read_case).

The logs are built by hand from the tool's real output:
- the summary past the print limit: NVIDIA compute-sanitizer prints "ERROR SUMMARY: N errors" and then "ERROR SUMMARY:
  M errors were not printed. Use --print-limit option to adjust the number of printed errors" (M of the N not shown;
  default limit 100), as in public memcheck and initcheck logs (e.g. "ERROR SUMMARY: 74476 errors" followed by
  "ERROR SUMMARY: 74376 errors were not printed. ...");
- "Internal Sanitizer Error: The Sanitizer encountered an error while launching kernel_name and didn't track the
  launch. Errors might go undetected. (Unable to allocate enough memory to perform the requested operation)": the
  Compute Sanitizer user guide, Usage Guide / Memory Footprint; public runs report these records beside a zero error
  count (the tool does not count them as errors);
- racecheck's "RACECHECK SUMMARY: 1 hazard displayed (0 errors, 1 warning)" and "Program hit cudaErrorLaunchFailure
  (error 719) due to "unspecified launch failure" on CUDA API call to ..." lines: the user guide's examples.
"""

from __future__ import annotations

from pathlib import Path

from validation.kinds.sanitizer import case_problem, read_case

HEADER = "========= COMPUTE-SANITIZER\n"
INVALID_READ = ("========= Invalid __global__ read of size 4 bytes\n"
                "=========     at _sel_fwd_kernel+0x4c80 in selection.py:223\n"
                "=========     by thread (0,0,0) in block (60,0,0)\n"
                "=========     Address 0x7f3c2e000400 is out of bounds\n"
                "=========     and is 1 bytes after the nearest allocation at 0x7f3c2e000000 of size 1024 bytes\n"
                "=========     Saved host backtrace up to driver entry point at kernel launch time\n"
                "=========\n")


def _case(tmp_path: Path, text: str, status: str = "ok", returncode: int = 0):
    log = tmp_path / "stdout.log"
    log.write_text(text)
    return read_case(log, status, returncode, f"exit code {returncode}")


def test_errors_past_the_print_limit_are_counted_once(tmp_path):
    """257 errors, 100 printed: the count is the summary's 257, not 257 + the 157 "were not printed" (414)."""
    text = (HEADER + INVALID_READ * 2 + "Traceback (most recent call last):\n"
            "RuntimeError: CUDA error: unspecified launch failure\n"
            "========= Target application returned an error\n"
            "========= ERROR SUMMARY: 257 errors\n"
            "========= ERROR SUMMARY: 157 errors were not printed. Use --print-limit option to adjust the number of "
            "printed errors\n")
    case = _case(tmp_path, text, "failed", 1)
    assert (case.status, case.errors) == ("errors", 257)
    assert case.first_error.startswith("Invalid __global__ read of size 4 bytes | at _sel_fwd_kernel+0x4c80")


def test_one_error_past_a_print_limit_of_one(tmp_path):
    """2 errors with --print-limit 1: "ERROR SUMMARY: 2 errors" then "1 errors were not printed" (the tool's own
    grammar): 2 errors."""
    text = (HEADER + INVALID_READ + "========= ERROR SUMMARY: 2 errors\n"
            "========= ERROR SUMMARY: 1 errors were not printed. Use --print-limit option to adjust the number of "
            "printed errors\n")
    assert _case(tmp_path, text, "failed", 1).errors == 2


def test_an_untracked_kernel_launch_is_never_clean(tmp_path):
    """The sanitizer ran out of memory for its tracking data and did not check a launch: "ERROR SUMMARY: 0 errors"
    and exit 0, yet errors in that kernel went undetected; the case is not clean and says why."""
    text = (HEADER +
            "========= Internal Sanitizer Error: The Sanitizer encountered an error while launching _sel_fwd_kernel "
            "and didn't track the launch. Errors might go undetected. (Unable to allocate enough memory to perform "
            "the requested operation)\n"
            "qualify: every kernel forward and backward ran\n"
            "========= ERROR SUMMARY: 0 errors\n")
    case = _case(tmp_path, text)
    assert case.status == "untracked" and case.errors == 0
    assert case.first_error.startswith("Internal Sanitizer Error: The Sanitizer encountered an error")
    assert "did not track every kernel launch" in case_problem(case)


def test_an_untracked_launch_beside_real_errors_is_an_error_case(tmp_path):
    text = (HEADER + INVALID_READ +
            "========= Internal Sanitizer Error: The Sanitizer encountered an error while launching k and didn't "
            "track the launch. Errors might go undetected. (Unable to allocate enough memory to perform the "
            "requested operation)\n"
            "========= ERROR SUMMARY: 1 error\n")
    case = _case(tmp_path, text, "failed", 1)
    assert (case.status, case.errors) == ("errors", 1)


def test_the_program_naming_the_phrase_on_its_own_output_is_not_the_sanitizer(tmp_path):
    """Only the sanitizer's own ("=========") lines say a launch went untracked."""
    text = HEADER + "checking: Internal Sanitizer Error handling\n========= ERROR SUMMARY: 0 errors\n"
    assert _case(tmp_path, text).status == "clean"


def test_a_racecheck_warning_and_an_api_error_each_fail_the_case(tmp_path):
    warning = (HEADER + "========= Warning: Race reported between Read access at k(int *, int)+0x60 in a.py:3\n"
               "=========     and Write access at k(int *, int)+0x70 in a.py:4 [2 hazards]\n=========\n"
               "========= RACECHECK SUMMARY: 1 hazard displayed (0 errors, 1 warning)\n")
    case = _case(tmp_path, warning)
    assert (case.status, case.errors) == ("errors", 1)
    api = (HEADER + INVALID_READ +
           '========= Program hit cudaErrorLaunchFailure (error 719) due to "unspecified launch failure" on CUDA API '
           "call to cudaStreamSynchronize.\n"
           "=========     Saved host backtrace up to driver entry point at error\n=========\n"
           "========= Target application returned an error\n========= ERROR SUMMARY: 2 errors\n")
    case = _case(tmp_path, api, "failed", 1)
    assert (case.status, case.errors) == ("errors", 2)


def test_a_log_cut_off_before_its_summary_or_a_failed_program_never_passes(tmp_path):
    """Killed mid-output (errors printed, no summary), a program that never made a CUDA call (the tool's "Target
    application terminated before first instrumented API call", exit 255, no summary), and 0 errors from a program
    that returned an error."""
    assert _case(tmp_path, HEADER + INVALID_READ, "failed", -9).status == "no summary"
    never = HEADER + "========= Error: Target application terminated before first instrumented API call\n"
    assert _case(tmp_path, never, "failed", 255).status == "no summary"
    failed = HEADER + "========= Target application returned an error\n========= ERROR SUMMARY: 0 errors\n"
    assert _case(tmp_path, failed, "failed", 1).status == "failed"
