"""The layer's launch choices against a baseline, alternated in ONE process: each choice's forward and backward
beside the baseline's, pass blocks adjacent in time, round by round.

    python benchmarks/bench_choices.py --device cuda --dtype bf16 --seq-len 65536 --batch 1 --arm shipped \\
        --arm dq_query=sel-dq-choice:query --arm out_partial=sel-out-choice:partial --json choices_65536.json
    python benchmarks/bench_choices.py --seq-len 256 --path nsa-torch --arm sort=topk-choice:sort \\
        --arm topk=topk-choice:topk                                          # CPU: the top-n_sel choice only
    python benchmarks/bench_choices.py ... --resume choices_65536.json       # after a crash: the arms left

An arm is NAME (every choice as shipped: "auto") or NAME=FLAG:VALUE[,FLAG:VALUE...], FLAG one of bench_attention's
choice options without its dashes (sel-dq-choice, query-choice, topk-choice, ...: the process-wide X_CHOICE each
sets, read by the kernels at every launch). The first arm is the baseline; every other arm is compared with it.

Why one process: bench_attention.py measures each case in a fresh process (its own peak memory), which costs a
process start, torch's import, CUDA's start-up and the kernels' compile per case: about 12 s a case on an H200
(reports/gpu/2026-11-30-h200/log.txt), so the A/B of 8 choices at two shapes, 2 rounds, took 64 processes (about
13 minutes of a GPU session's 15). Here one layer, one input and one process serve every arm.

How an arm is measured: for each arm in turn, for each round r = 1..--rounds, a block of the baseline and a block
of the arm, adjacent (the baseline first in odd rounds, the arm first in even ones: ABBA, so that a drift in the
device's speed cannot favour the arm in every round); a block is bench_attention's timed_passes (one untimed pass,
which compiles the arm's kernels the first time, --warmup untimed passes, --repeats timed ones), each choice set
before it and every other one reset to what it was when the process started. Per round the ratio of the arm's
median to the baseline's (forward, backward, forward + backward), and the verdict of benchmarks/ab_table.py
(round_verdict: "faster in every round" on forward + backward; fewer than two rounds decide nothing). An arm whose
choices in effect (each "auto" resolved) equal the baseline's is measured and said to be the same kernels.

A crash loses only the arm being measured: the JSON is written after every block, with the arm in progress named.
An arm that raises is recorded as failed and the next arm runs, unless CUDA no longer works (an illegal memory
access leaves the context unusable): then the process ends, and --resume FILE continues: the finished arms kept,
the one in progress when the process ended recorded as failed ("crashed"), the rest measured (--resume of a file
not there yet starts afresh, so a script can always pass it). SIGTERM (a step's time limit: timeout sends it before
KILL) is no crash: the process exits 124 and --resume measures the arm in progress then afresh (cut a second time,
it is failed, so that the arms after it are measured).
Outputs: each block keeps its last pass's loss and input-gradient norm. An arm whose outputs are not the baseline's
within 2% is failed (it computes something else: a wrong tile, an out-of-bounds write), and when the baseline's own
outputs change during the run (memory overwritten under every later block) the run says so and exits 1.
Peak memory: CUDA's max_memory_allocated per block (none on CPU, where the process's peak is every arm's).
At 2,048 B 8 an eager pass is partly host-bound (on the H200 about 4 ms of GPU time in 7 ms of wall time), so a
choice that launches fewer kernels gains there more than under CUDA graphs; at 65,536 the GPU time dominates.
Exit 0 when every arm was measured, 1 when one failed, 2 for invalid options, 124 when terminated.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ab_table import is_time, round_verdict  # noqa: E402  (same directory: one verdict rule for every A/B of a GPU run)
from bench_attention import (PATHS, SHAPES, _CHOICE_FLAGS, build, choice_place, choice_problem,  # noqa: E402
                             choices_in_effect, no_cuda_here, pass_stats, pass_timer, repeated, timed_passes)

MODES = ("fwd", "bwd", "fwdbwd")


def parse_arm(text: str) -> tuple[str, dict[str, str]]:
    """NAME or NAME=FLAG:VALUE[,FLAG:VALUE...] -> (name, {flag: value}); ValueError naming what is wrong."""
    name, _, settings = text.partition("=")
    if not name or any(c in name for c in " /:,") or name.startswith("-"):
        raise ValueError(f"--arm {text!r}: a name first (no spaces, '/', ':' or ','), e.g. dq_query=sel-dq-choice:query")
    out: dict[str, str] = {}
    for item in filter(None, settings.split(",")) if settings else ():
        flag, colon, value = item.partition(":")
        if not colon or flag not in _CHOICE_FLAGS:
            raise ValueError(f"--arm {text!r}: {item!r} is not FLAG:VALUE with FLAG one of {', '.join(_CHOICE_FLAGS)}")
        if why := choice_problem(flag, value):
            raise ValueError(f"--arm {text!r}: {why}")
        if flag in out:
            raise ValueError(f"--arm {text!r}: {flag} given twice")
        out[flag] = value
    if settings == "" and "=" in text:
        raise ValueError(f"--arm {text!r}: nothing after '=' (give NAME alone for every choice as shipped)")
    return name, out


class Choices:
    """The process-wide launch choices the arms set: an arm's set, every other one back to its value at the start
    (only the modules of those choices are imported: the top-n_sel choice alone needs no Triton)."""

    def __init__(self, flags):
        self.places = {}
        for flag in flags:
            module, attribute = choice_place(flag)
            self.places[flag] = (module, attribute, getattr(module, attribute))

    def apply(self, settings: dict[str, str]) -> None:
        for flag, (mod, attribute, start) in self.places.items():
            setattr(mod, attribute, settings.get(flag, start))

    def restore(self) -> None:
        self.apply({})


def measure_block(one, warmup: int, repeats: int, device: str) -> dict:
    """One block: bench_attention's timed passes of `one`, their min / median / max per mode (seconds)."""
    import torch

    def reset_peak():
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()

    times = timed_passes(one, warmup, repeats, reset_peak)
    block = {"times_s": pass_stats(times), "passes": len(times)}
    outputs = getattr(one, "outputs", None)  # the last pass's loss and input-gradient norm (layer_pass)
    if outputs:
        block.update({k: float(v) for k, v in outputs.items()})
    if device == "cuda":
        block["peak_gb"] = torch.cuda.max_memory_allocated() / 2**30
    return block


OUTPUT_RTOL = 0.02  # an arm's loss and input-gradient norm against the baseline's (bf16 kernels summing apart)


def outputs_differ(base: dict, other: dict) -> str | None:
    """Why a block's outputs (loss, grad_norm: the last pass's) are not the baseline block's within OUTPUT_RTOL, or
    None: an arm that computes something else (a kernel writing out of bounds, a wrong tile) is no speed result."""
    for key in ("loss", "grad_norm"):
        a, b = other.get(key), base.get(key)
        if a is None or b is None:
            continue
        if not (math.isfinite(a) and math.isfinite(b)) or abs(a - b) > OUTPUT_RTOL * max(abs(b), 1e-12):
            return f"{key} {a:.6g} against the baseline's {b:.6g}"
    return None


def ratios(base: dict, arm: dict) -> dict:
    """{mode: arm median / baseline median} of one round (a time ratio: below 1 the arm is faster)."""
    out = {}
    for mode in MODES:
        a, b = arm["times_s"][mode]["median"], base["times_s"][mode]["median"]
        out[mode] = a / b if is_time(a) and is_time(b) else None  # a time that is no duration: no ratio
    return out


def layer_pass(args):
    """bench_attention's pass_timer for the run's layer and input: `one()` runs a forward and a backward, returns
    their seconds and keeps the pass's loss and input-gradient norm (one.outputs)."""
    import torch

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    torch.manual_seed(0)
    shape = SHAPES[args.shape]
    module = build(args.path, shape, args.device, dtype, args.index_build)
    x = torch.randn(args.batch, args.seq_len, shape["dim"], device=args.device, dtype=dtype, requires_grad=True)
    return pass_timer(module, x, args.device)


def _write(path: Path | None, record: dict) -> None:
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(record, indent=2))
        tmp.replace(path)


def _resumed(path: Path, record: dict) -> dict:
    """The arms of an earlier run of the same measurement in `path` (the one in progress then: crashed)."""
    try:
        old = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise SystemExit(f"--resume {path}: not readable as this benchmark's JSON ({exc})")
    same = ("path", "shape", "seq_len", "batch", "device", "dtype", "index_build", "repeats", "warmup", "rounds",
            "arm_settings")
    differs = [k for k in same if old.get(k) != record[k]]
    if differs:
        raise SystemExit(f"--resume {path}: another measurement ({', '.join(differs)} differ): give the same options")
    arms = dict(old.get("arms", {}))
    if old.get("in_progress"):
        arms[old["in_progress"]] = {**arms.get(old["in_progress"], {}), "error": "crashed (the process ended "
                                    "while this arm was measured: see the step's log)"}
    return arms


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arm", action="append", default=[], metavar="NAME[=FLAG:VALUE,...]",
                    help="an arm (repeatable, at least two); the first is the baseline")
    ap.add_argument("--seq-len", type=int, default=256, help="S (default 256)")
    ap.add_argument("--batch", type=int, default=1, help="B (default 1)")
    ap.add_argument("--path", default="nsa-triton", choices=[p for p in PATHS if p.startswith("nsa-")],
                    help="the layer (default nsa-triton; the kernels' choices act on it only, the top-n_sel on both)")
    ap.add_argument("--shape", default=None, choices=tuple(SHAPES), help="default: m7c on CUDA, small on CPU")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--dtype", default=None, choices=("fp32", "bf16"), help="default: bf16 on CUDA, fp32 on CPU")
    ap.add_argument("--index-build", default="auto", choices=("auto", "torch", "triton"))
    ap.add_argument("--rounds", type=int, default=2, help="rounds per arm (default 2; fewer than 2 decide nothing)")
    ap.add_argument("--repeats", type=int, default=5, help="timed passes per block (default 5)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed passes per block after its first (default 2)")
    ap.add_argument("--json", type=Path, help="write every block and comparison here (after every block)")
    ap.add_argument("--resume", type=Path, metavar="FILE", help="continue the measurement FILE holds")
    ap.add_argument("--dry-run", action="store_true", help="check the options and list the arms, measure nothing")
    args = ap.parse_args(argv)
    cuda = args.device == "cuda"
    args.shape = args.shape or ("m7c" if cuda else "small")
    args.dtype = args.dtype or ("bf16" if cuda else "fp32")
    if args.seq_len < 1 or args.batch < 1 or args.rounds < 1 or args.repeats < 1 or args.warmup < 0:
        ap.error("--seq-len, --batch, --rounds and --repeats must be >= 1, --warmup >= 0")
    try:
        arms = [parse_arm(a) for a in args.arm]
    except ValueError as exc:
        ap.error(str(exc))
    if len(arms) < 2:
        ap.error("give at least two --arm: the baseline first, then each arm to compare with it")
    if twice := repeated([name for name, _ in arms]):
        ap.error(f"--arm: {', '.join(twice)} named more than once")
    kernel_flags = [f"{name} ({flag})" for name, settings in arms for flag in settings
                    if flag != "topk-choice" and args.path != "nsa-triton"]
    if kernel_flags:
        ap.error(f"--path {args.path}: the kernels' choices act on nsa-triton only: {', '.join(kernel_flags)}")
    if cuda and not args.dry_run and (why := no_cuda_here()):
        ap.error(f"--device cuda: {why}")
    base_name, base_settings = arms[0]
    print("reproduce: python benchmarks/bench_choices.py "
          + " ".join(shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv)))
    print(f"layer {args.path} {args.shape} S={args.seq_len} B={args.batch} {args.device} {args.dtype}: per arm "
          f"{args.rounds} rounds of a baseline block and an arm block (ABBA), each {args.repeats} timed passes "
          f"after 1 + {args.warmup} untimed; times in ms, medians; ratio = arm / baseline ({base_name})")
    if args.dry_run:
        for name, settings in arms:
            what = ", ".join(f"{f} {v}" for f, v in settings.items()) or "every choice as shipped"
            print(f"  {name}: {what}" + ("  (baseline)" if name == base_name else ""))
        return 0

    import torch

    record = {"bench": "choices", "argv": sys.argv[1:] if argv is None else argv, "path": args.path,
              "shape": args.shape, "dims": SHAPES[args.shape], "seq_len": args.seq_len, "batch": args.batch,
              "device": args.device, "dtype": args.dtype, "index_build": args.index_build, "repeats": args.repeats,
              "warmup": args.warmup, "rounds": args.rounds, "baseline": base_name,
              "arm_settings": {n: s for n, s in arms}, "torch": torch.__version__,
              "device_name": torch.cuda.get_device_name() if cuda else "cpu", "arms": {}, "in_progress": None}
    if args.resume is not None and args.resume.exists():
        record["arms"] = _resumed(args.resume, record)
    choices = Choices(sorted({flag for _, settings in arms for flag in settings}))
    previous = signal.signal(signal.SIGTERM, _cut)  # the step's time limit (timeout's first signal)
    try:
        one = layer_pass(args)
        choices.apply(base_settings)
        base_choices = choices_in_effect(args.path, args.index_build)
        failed = False
        for name, settings in arms[1:]:
            done = record["arms"].get(name, {})
            if "error" in done or "verdict" in done:
                print(f"  {name}: {'kept from ' + str(args.resume) if 'verdict' in done else done['error']}",
                      flush=True)
                failed |= "error" in done
                continue
            choices.apply(settings)
            arm = {"settings": settings, "choices": choices_in_effect(args.path, args.index_build), "rounds": []}
            if arm["choices"] == base_choices:
                arm["note"] = "the same choices in effect as the baseline: an A/A comparison"
            if done.get("cuts"):  # cut by the time limit in an earlier process: measured afresh, once more
                arm["cuts"] = done["cuts"]
            record["arms"][name], record["in_progress"] = arm, name
            _write(args.json, record)
            try:
                for r in range(1, args.rounds + 1):
                    blocks = {}
                    for who in ((base_name, name) if r % 2 else (name, base_name)):
                        choices.apply(base_settings if who == base_name else settings)
                        blocks[who] = measure_block(one, args.warmup, args.repeats, args.device)
                        _write(args.json, record)
                    arm["rounds"].append({"round": r, "first": "baseline" if r % 2 else "arm",
                                          "baseline": blocks[base_name], "arm": blocks[name],
                                          "ratio": ratios(blocks[base_name], blocks[name])})
                    if why := outputs_differ(blocks[base_name], blocks[name]):
                        raise OutputsDiffer(f"round {r}: {why}")
            except Exception as exc:  # noqa: BLE001 - an arm that fails (out of memory, a kernel's error) is a result
                arm["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                failed = True
                if cuda and not context_alive():
                    record["in_progress"] = None
                    _write(args.json, record)
                    print(f"  {name}: failed: {arm['error']}; the CUDA context is lost: the other arms are left to "
                          "--resume", flush=True)
                    return 1
            finally:
                choices.restore()
            if "error" not in arm:
                arm["verdict"] = round_verdict([p["ratio"]["fwdbwd"] for p in arm["rounds"]])
            record["in_progress"] = None
            _write(args.json, record)
            print(line(name, arm), flush=True)
        # the baseline's own outputs over the run: a kernel that wrote out of bounds into the layer's parameters or
        # input changes every later block's, the baseline's too: then no block after it is a valid figure
        base_blocks = [rnd["baseline"] for a in record["arms"].values() for rnd in a.get("rounds", [])]
        drift = next((why for b in base_blocks[1:] if (why := outputs_differ(base_blocks[0], b))), None)
        if drift:
            record["baseline_outputs_changed"] = drift
            _write(args.json, record)
            print(f"  the baseline's outputs changed during the run ({drift}): memory was overwritten, no figure of "
                  "this run is valid", flush=True)
            return 1
        return 1 if failed else 0
    except Cut:
        # cut by the time limit, not crashed: the arm in progress is measured afresh by --resume; cut a second time,
        # it is failed (it does not fit the step's time), so that the arms after it are measured
        if (name := record["in_progress"]) is not None:
            cuts = record["arms"][name].get("cuts", 0) + 1
            record["arms"][name] = {"cuts": cuts} if cuts < 2 else {
                **record["arms"][name], "cuts": cuts,
                "error": "cut twice by the step's time limit while measured (see the step's log)"}
            record["in_progress"] = None
            _write(args.json, record)
            print(f"  {name}: cut by SIGTERM (the time limit) while measured"
                  + (": left to --resume" if cuts < 2 else f": {record['arms'][name]['error']}"), flush=True)
        return 124
    finally:
        signal.signal(signal.SIGTERM, previous)


class Cut(BaseException):
    """SIGTERM while measuring: the step's time limit (timeout sends it first), not a fault of the arm in progress (a
    BaseException, so that an arm's `except Exception` does not take it for the arm's failure)."""


def _cut(signum, frame):
    raise Cut()


class OutputsDiffer(RuntimeError):
    """An arm's loss or input gradient is not the baseline's: it computes something else."""


def context_alive() -> bool:
    """Whether CUDA still works after an arm's error (an illegal memory access leaves the context unusable; an
    out-of-memory, a compile error or a host-side error does not)."""
    import torch

    try:
        torch.cuda.synchronize()
        torch.ones(1, device="cuda").add_(1).item()
        return True
    except Exception:  # noqa: BLE001 - any error here means the context is gone
        return False


def line(name: str, arm: dict) -> str:
    if "error" in arm:
        return f"  {name}: failed: {arm['error']}"
    per_round = "  ".join(
        f"r{p['round']}: fwd {p['arm']['times_s']['fwd']['median'] * 1e3:.3f}/{p['baseline']['times_s']['fwd']['median'] * 1e3:.3f}"
        f" fwd+bwd {p['arm']['times_s']['fwdbwd']['median'] * 1e3:.3f}/"
        f"{p['baseline']['times_s']['fwdbwd']['median'] * 1e3:.3f} = {p['ratio']['fwdbwd']:.3f}"
        for p in arm["rounds"])
    return f"  {name}: {per_round}  -> {arm['verdict']}" + (f" ({arm['note']})" if "note" in arm else "")


if __name__ == "__main__":
    sys.exit(main())
