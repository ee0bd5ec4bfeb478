"""The training loop: one Trainer per rank builds the model, wraps it (DDP / FSDP2), steps the optimizer and
writes the run's files (nsa.training.outputs). The command line is nsa.training.cli.
"""


from __future__ import annotations

import contextlib
import logging
import math
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
import yaml

from nsa import observability, toggles
from nsa.attention.kernels import index_build, prepare_compile, resolve
from nsa.config import ModelConfig
from nsa.loss import check_loss, resolve_loss
from nsa.model import NSAModel, flops_per_token, lm_loss
from nsa.toggles import Toggles
from nsa.training import checkpoint, comm_count, distributed, graphs, metrics, model_faults, outputs, timeline
from nsa.training.comm_model import activation_bytes, activations_basis, comm_model, memory_model, param_specs
from nsa.training.config import RunConfig, UsageError, save_config
from nsa.training.data import build_eval_source, build_source
from nsa.training.distributed import DistInfo, first_use_order
from nsa.training.heartbeat import HeartbeatWriter
from nsa.training.metrics import device_name, memory_detail_gb, memory_gb, mfu, peak_flops
from nsa.training.optim import (build_adamw, decay_length, keep_settings, lr_at, make_capturable, set_lr,
                                use_fused_adamw)
from nsa.training.safety import CSV_FAULTS_STOPPING_WRITER, RunControl, damage_training_csv
from nsa.training.summary import SummaryAccumulator, format_summary
from nsa.training.watchdog import HALT_NAME

log = logging.getLogger("nsa.training")

EXIT_OK, EXIT_CRASH, EXIT_USAGE, EXIT_NONFINITE = 0, 1, 2, 3


def parallel_mode(requested: str, world_size: int) -> str:
    if world_size > 1:
        if requested == "none":
            raise UsageError(f"launched with {world_size} ranks but parallel mode is 'none' (--ddp 0): "
                             "use --ddp 1 or --fsdp, or launch a single process")
        return "ddp" if requested == "auto" else requested
    return "none"


def perplexity(loss: float) -> float:
    """exp(loss), val.csv's val_ppl: inf where it passes the largest float (a loss above about 709.78 nats), NaN for
    a NaN loss. (It was exp(min(loss, 50)): a loss of 60 nats read 5.2e21 instead of 1.1e26.)"""
    try:
        return math.exp(loss)
    except OverflowError:
        return math.inf


def attention_kernel(model: ModelConfig, device: torch.device, dtype: torch.dtype | None = None) -> str:
    """What the attention layers of `model` (the resolved config: the layer toggles applied) run on `device` with
    their matmuls in `dtype` (the run's autocast dtype, else its parameters'): sdpa (the dense twin), sequential
    (NSA's per-token path), or the batched path's kernels for this device and dtype, torch | triton, as the layer
    resolves them at each forward (nsa.attention.kernels.resolve; KernelUnavailable where triton is asked for and
    cannot run: refused at start-up, not at the first forward)."""
    if model.attention == "dense":
        return "sdpa"
    if model.nsa.prefill != "batched":
        return "sequential"
    return resolve(model.nsa.kernel, device, model.nsa, dtype)


class Trainer:
    def __init__(self, cfg: RunConfig, config_path: str, info: DistInfo, tg: Toggles, resume: bool, argv):
        self.cfg, self.info, self.tg = cfg, info, tg
        # the model this run builds: the config's, with the layer toggles read at start-up applied (env.json's
        # "config" and config.yaml record the config itself, as the file and the flags give it)
        self.model_cfg = cfg.model.with_toggles(tg)
        tc = cfg.train
        self.out = Path(tc.out_dir)
        self.parallel = parallel_mode(tc.parallel, info.world_size)
        if tc.seq_len < cfg.model.nsa.l:
            raise UsageError(f"train.seq_len={tc.seq_len} is shorter than one compression block "
                             f"(model.l={cfg.model.nsa.l})")
        self.device = info.device
        self.amp_dtype = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[tc.precision]
        self.notes: list[str] = []

        # outputs (rank 0 writes the shared files; every rank its heartbeat)
        if info.is_main:
            try:
                self.out.mkdir(parents=True, exist_ok=True)
            except FileExistsError:
                raise UsageError(f"train.out_dir {self.out}: it exists and is not a directory") from None
            except OSError as exc:
                raise UsageError(f"train.out_dir {self.out}: cannot be created ({exc.strerror or exc})") from None
            stale = self.out / HALT_NAME
            if resume and stale.exists():
                stale.replace(self.out / (HALT_NAME + ".prev"))
                self.say(f"moved a .HALT left by an earlier run to {HALT_NAME}.prev")
            # a resume without a checkpoint starts at step 0 like a fresh run: the earlier run's files are moved
            # aside too, so that its rows, heartbeats and error files are neither replaced nor mixed with this run's
            fresh = not resume or checkpoint.latest_checkpoint(self.out) is None
            archived = outputs.archive_previous_run(self.out) if fresh else None
            if archived is not None:
                self.say(f"a previous run's files in {self.out} were moved to {archived} " +
                         ("(--resume found no checkpoint to continue from)" if resume else
                          "(use --resume to continue a run instead)"))
        distributed.barrier(info)
        # a heartbeat's step is the step the rank has reached: for a resume, that of the checkpoint it continues from
        self.boot_step = (checkpoint.latest_step(self.out) if resume else None) or 0
        self.heartbeat = HeartbeatWriter(self.out, info.rank)
        self.heartbeat.write(self.boot_step, "boot", world_size=info.world_size, device=str(self.device))
        self.start_step = 0
        # what summary.json and timeline.json are made of, from here on: a run that fails at start-up writes them
        # too (_setup_failed), with no step and the milestones it reached; _setup fills in the rest
        self.timeline = timeline.current()
        self._timeline_ranks: list[dict] | None = None  # every rank's milestones, gathered after the first step
        self.summary = SummaryAccumulator(
            parallel=self.parallel, world_size=info.world_size, device_type=self.device.type,
            tokens_per_step=info.world_size * tc.batch_size * tc.accum * tc.seq_len,
            samples_per_step=info.world_size * tc.batch_size * tc.accum, steps_planned=tc.steps,
            fsdp_reshard=tc.fsdp_reshard if self.parallel == "fsdp" else None)
        self.comm: comm_count.CommCounter | None = None
        self.comm_counted_by = {"ddp": "ddp_comm_hook", "fsdp": "fsdp2_collective_wrappers"}.get(self.parallel)
        self.comm_prediction: dict | None = None
        self.memory_prediction: dict | None = None
        try:
            self._setup(cfg, config_path, resume, argv)
        except BaseException as exc:
            self._setup_failed(exc)
            raise
        # the stop handlers, installed for the start-up, are installed again by run(); a SIGTERM or SIGINT received
        # meanwhile stays requested (self.control.stop_signal), and the first step stops the run on every rank
        self.control.uninstall()

    def _setup(self, cfg: RunConfig, config_path: str, resume: bool, argv) -> None:
        """Everything after the boot heartbeat: model, wrapping, optimizer, data, resume, the run's files. A failure
        here is recorded (heartbeat "error", status.json) by __init__ before it propagates."""
        info, tg, tc = self.info, self.tg, cfg.train
        self.control = RunControl(self.out, info.rank, tg.fault)
        # SIGTERM / SIGINT from here on request a stop, as in the loop (the first step agrees on it on every rank,
        # saves a checkpoint and ends "terminated"), instead of ending the rank with its status.json unwritten or
        # "running" (the model build, a checkpoint load, the wrapping and the data source may take minutes)
        self.control.install()

        # model, wrapping, optimizer
        torch.manual_seed(tc.seed)
        net = NSAModel(self.model_cfg)
        self.model_faults = model_faults.install(net, tg.fault)  # NSA_FAULT's model fault (a testing aid), if any
        self.timeline.mark("model_built")
        self._starting("model_built")
        self.net = net.to(self.device)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.timeline.mark("model_on_device")
        self._starting("model_on_device")
        self.n_params = self.net.num_params()
        self.attention_kernel = attention_kernel(self.model_cfg, self.device,
                                                 self.amp_dtype or next(self.net.parameters()).dtype)
        check_loss(self.model_cfg.loss, self.device)  # NSA_LOSS=fused where Triton cannot run: refused here
        # CUDA graphs (nsa.training.graphs): refused here where they cannot work; DDP is built on the capture's
        # side stream, so the side stream exists before the wrapping
        self.capture = None
        if tc.cuda_graphs:
            graphs.check_supported(self.device, self.attention_kernel)
            self.capture = graphs.CudaCapture(self.device)
        self.flops_per_token = flops_per_token(cfg.model, tc.seq_len)
        # communication: counted at the calls (comm_count) and predicted from the real parameters (comm_model)
        self.comm = (comm_count.CommCounter(measure_time=self.device.type != "cuda")
                     if self.parallel != "none" else None)
        # DDP buckets gradients in the order they become ready, the reverse of the forward's first use: one probe
        # forward (no_grad) gives that order; the other strategies need only the registration order
        probe = (torch.zeros(1, min(tc.seq_len, 512), dtype=torch.long, device=self.device)
                 if self.parallel == "ddp" else None)
        specs = param_specs(self.net, first_use_order(self.net, probe) if probe is not None else None)
        self.comm_prediction = comm_model(
            specs, self.parallel, world_size=info.world_size, accum=tc.accum, bucket_cap_mb=tg.ddp_bucket_mb,
            compress=tg.ddp_compress if self.parallel == "ddp" else "none",
            reshard_after_forward=tc.fsdp_reshard, rebuilt=self.capture is not None).to_dict()
        self.memory_prediction = memory_model(  # the model built (NSA_LOSS applied); DDP's grads in its buckets
            specs, self.parallel, world_size=info.world_size, reshard_after_forward=tc.fsdp_reshard,
            activations=activation_bytes(self.model_cfg, tc.batch_size, tc.seq_len, tc.precision),
            gradient_as_bucket_view=self.capture is not None)  # under CUDA graphs (_wrap)
        self.memory_prediction["activations_basis"] = activations_basis(self.device.type, self.attention_kernel)
        self.model: nn.Module = self._wrap(self.net)
        self._starting("model_wrapped")
        fused, why = use_fused_adamw(tg.opt_fused, list(self.net.parameters()))
        if why is not None:
            self.say(f"NSA_OPT_FUSED=1 is ignored: {why}; AdamW runs unfused")
        self.optimizer = build_adamw(self.net, tc.lr, tc.weight_decay, (tc.beta1, tc.beta2), fused)
        self.scaler = torch.amp.GradScaler(self.device.type) if tc.precision == "fp16" else None
        self._starting("optimizer_built")

        # data
        data_args = dict(vocab_size=cfg.model.vocab_size, seq_len=tc.seq_len, batch_size=tc.batch_size,
                         rank=info.rank, world_size=info.world_size, seed=tc.seed)
        self.source = build_source(cfg.data, **data_args)
        if cfg.data.dataset == "synthetic" and cfg.data.path is not None:  # --data-path without --dataset text
            self.say(f"data.path={cfg.data.path} is ignored: data.dataset is synthetic (--dataset text or fineweb_edu "
                     "reads it)")
        self.eval_source = build_eval_source(cfg.data, **data_args) if tc.eval_every > 0 else None
        self._starting("data_ready")

        # resume
        if resume:
            found = self._resume_choice()
            if found is None:
                self.say(f"--resume: no checkpoint in {self.out / checkpoint.CHECKPOINT_DIR}; starting at step 0")
            else:
                # the checkpoint's moments and step counts; this run's AdamW settings (config, NSA_OPT_FUSED)
                self.heartbeat.write(self.boot_step, "loading", path=str(found))  # one long call (LONG_CALL_MSGS)
                with keep_settings(self.optimizer) as changed:
                    step, data_state = checkpoint.load(found, self.net, self.optimizer, info, scaler=self.scaler)
                self._starting("checkpoint_loaded")
                if step > tc.steps:
                    raise UsageError(f"--resume: the checkpoint {found} is at step {step}, past train.steps "
                                     f"({tc.steps}); ask for at least {step} steps")
                self.start_step = step
                changed_data = self.source.load_state_dict(data_state)
                self.say(f"resumed from {found} (step {self.start_step})")
                if changed_data and self.info.is_main:
                    self.notes.append(changed_data)  # logged by the source, on every rank
                if changed:
                    self.say("resumed with this run's AdamW settings, which differ from the checkpoint's: "
                             + "; ".join(changed))
        self.last_saved = self.start_step
        self._eval_compiled = False  # whether an evaluation's forward ran (compiled, under torch.compile)
        self.graphed: graphs.GraphedStep | None = None
        if self.capture is not None:  # after the resume: a loaded optimizer is made capturable too
            make_capturable(self.optimizer)
            ddp = self.parallel == "ddp"
            self.graphed = graphs.GraphedStep(
                capture=self.capture, micro_step=self._micro_step, grad_norm=self._grad_norm,
                set_record_stats=self.net.set_record_stats, optimizer=self.optimizer,
                params=list(self.net.parameters()), accum=tc.accum, batch_size=tc.batch_size, seq_len=tc.seq_len,
                device=self.device, record_stats=not tg.aux_stats_disable,
                warmup_steps=graphs.DDP_WARMUP_STEPS if ddp else graphs.WARMUP_STEPS, counter=self.comm)
        self._fault_notes()
        ran = tc.steps - self.start_step
        if tc.profile_steps > 0 and ran < tc.profile_start + tc.profile_steps:
            self.say(f"train.profile_steps={tc.profile_steps}: no profiler trace will be written: it covers steps "
                     f"{tc.profile_start + 1}-{tc.profile_start + tc.profile_steps} of this process (after "
                     f"train.profile_start={tc.profile_start}), which runs {ran} step(s)")

        for unknown in tg.unknown:  # a misspelt toggle: said, so that nobody takes it for set
            self.say(f"{unknown}: ignored")

        # observability
        self.audit = observability.SdpaAudit() if tg.sdpa_audit and info.is_main else None
        observability.configure(nvtx=tg.nvtx, audit=self.audit)
        if tg.nvtx and self.device.type != "cuda":
            self.say("NSA_NVTX=1: no CUDA here, so the ranges appear only in torch profiler traces")
        if (tg.sdpa_flash_only or tg.sdpa_no_flash) and self.device.type != "cuda":
            self.say("SDPA backend restriction applies to the CPU kernels (flash = the fused CPU kernel)")
        self.peak = peak_flops(self.device, tc.precision, tc.peak_tflops)
        self._impossible_mfu_said = False
        columns = (list(outputs.TRAINING_COLUMNS) + list(outputs.COMM_COLUMNS)
                   + ([outputs.MFU_COLUMN[0]] if self.peak else []))
        self.csv = self.val_csv = self.tb = None
        nodes = distributed.node_records(info)  # a collective: every rank takes part
        if info.is_main:
            if self.start_step > 0:
                self._say_config_changes(cfg)
            env = outputs.environment(cfg.to_dict(), config_path, info.world_size, self.device, argv)
            env.update({"nodes": nodes, "nnodes": len(nodes)})
            env.update({"parallel": self.parallel, "n_params": self.n_params,
                        "flops_per_token": self.flops_per_token, "device_name": device_name(self.device),
                        "peak_flops": self.peak, "resumed_from_step": self.start_step,
                        "toggles": tg.record(),
                        "attention": self.model_cfg.attention, "attention_kernel": self.attention_kernel,
                        # the selected branch's index build that ran (the Triton path only)
                        "index_build": (index_build(self.model_cfg.nsa.index_build)
                                        if self.attention_kernel == "triton" else None),
                        "cuda_graphs": self.graphed.describe() if self.graphed is not None else {"enabled": False},
                        "optimizer": {"name": "AdamW",
                                      "fused": bool(self.optimizer.param_groups[0].get("fused"))}})
            resume_at = self.start_step if resume else None
            self.csv = outputs.CsvLog(self.out / outputs.TRAINING_CSV, columns, resume_step=resume_at)
            # a resume drops the val.csv rows written after its checkpoint even with evaluation now off: they
            # evaluated weights this run's history no longer has (this run writes none in their place)
            if tc.eval_every > 0 or (resume_at is not None and (self.out / outputs.VAL_CSV).exists()):
                self.val_csv = outputs.CsvLog(self.out / outputs.VAL_CSV, list(outputs.VAL_COLUMNS),
                                              resume_step=resume_at)
            for log_file in (self.csv, self.val_csv):
                if log_file is not None and log_file.kept_aside is not None:
                    self.say(f"--resume: {log_file.path.name} was damaged: {log_file.dropped} damaged row(s) (cut "
                             f"short, another number of cells, or no readable step) were dropped; the file as it was is {log_file.kept_aside.name}")
            self.tb = self._tensorboard()
            # config.yaml and env.json last, once every other part of the start-up has passed: a launch that fails
            # at start-up (a --resume whose training.csv or val.csv cannot be read) leaves the run's own as they
            # were, those of the run its checkpoint and rows come from, which the next --resume compares its config
            # with; not this failed launch's config beside that run's checkpoint and rows
            save_config(cfg, self.out / outputs.CONFIG_YAML)
            outputs.write_json(self.out / outputs.ENV_JSON, env)
            self._status("running", None, self.start_step)
        self._starting("ready")

    # a resumed run's keys that may differ from the earlier run's without a word: how long it runs, what it records
    # and where, how long it waits (the others change what is trained or how fast: those are named)
    RESUME_FREE_KEYS = tuple(f"train.{k}" for k in (
        "steps", "out_dir", "log_every", "save_every", "keep_checkpoints", "eval_every", "eval_batches",
        "profile_steps", "profile_start", "pg_timeout_s", "peak_tflops")) + ("data.loader_timeout_s",)

    def _say_config_changes(self, cfg: RunConfig) -> None:
        """On resume: a note naming every config key whose value differs from the earlier run's config.yaml (a
        changed batch size, seed or schedule makes the resumed run another run, which a reader of its training.csv
        should know); nothing where that file is missing or unreadable."""
        try:
            earlier = yaml.safe_load((self.out / outputs.CONFIG_YAML).read_text())
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            return
        if not isinstance(earlier, dict):
            return
        changes = []
        for section, values in cfg.to_dict().items():
            before = earlier.get(section) if isinstance(earlier.get(section), dict) else {}
            for key, value in values.items():
                name = f"{section}.{key}"
                if name not in self.RESUME_FREE_KEYS and key in before and before[key] != value:
                    changes.append(f"{name} {before[key]!r} -> {value!r}")
        if changes:
            self.say("resumed with a config that differs from the earlier run's config.yaml: " + "; ".join(changes))
        # train.steps is a key of the run's length, but with train.decay_steps unset it is the cosine's length too
        tc, train_before = cfg.train, earlier.get("train") if isinstance(earlier.get("train"), dict) else {}
        steps_before = train_before.get("steps")
        if (tc.lr_schedule == "cosine" and tc.decay_steps is None and train_before.get("decay_steps") is None
                and isinstance(steps_before, int) and steps_before != tc.steps and tc.steps > tc.warmup_steps):
            end_before = tc.warmup_steps + decay_length(None, steps_before, tc.warmup_steps)
            end_now = tc.warmup_steps + decay_length(None, tc.steps, tc.warmup_steps)
            self.say(f"train.steps {steps_before} -> {tc.steps} with train.decay_steps unset: the cosine decay now "
                     f"reaches its floor at step {end_now} (the earlier run's at step {end_before}), so the learning "
                     f"rate from step {self.start_step + 1} on follows the new length; set train.decay_steps to keep "
                     "one schedule across resumes")

    def _resume_choice(self) -> Path | None:
        """The checkpoint --resume continues from, the same on every rank (a collective): the latest that rank 0
        sees, or None where it sees none, broadcast by name. Each rank taking the latest it sees itself would have
        the ranks differ on a shared file system that shows a new step_N/ to some nodes later (checkpoint.load
        refuses that: the run would fail where it can resume). A rank that cannot see rank 0's checkpoint fails in
        load's checked read, which stops every rank with that rank's error; a rank that sees none of them loads
        rank 0's all the same, never starting at step 0 while the others resume. A checkpoint directory rank 0
        cannot list stops every rank with a CheckpointError naming it."""
        info = self.info
        choice: list = [None]
        if info.is_main:
            try:
                latest = checkpoint.latest_checkpoint(self.out)
                choice = [("found", latest.name) if latest is not None else ("none", None)]
            except OSError as exc:
                choice = [("error", f"--resume: {self.out / checkpoint.CHECKPOINT_DIR} cannot be listed "
                                    f"({type(exc).__name__}: {exc})")]
        if info.distributed:  # beside the other start-up collectives (node_records): every rank is here
            dist.broadcast_object_list(choice, src=0)
        kind, value = choice[0]
        if kind == "error":
            raise checkpoint.CheckpointError(value + ("" if info.is_main else " (on rank 0)"))
        return self.out / checkpoint.CHECKPOINT_DIR / value if kind == "found" else None

    def _setup_failed(self, exc: BaseException) -> None:
        """A failure after the boot heartbeat (a damaged checkpoint, a kernel this device cannot run, out of memory):
        the rank writes error_rank{r}.txt (its traceback, as a failure in the loop does: the validation suite's
        diagnosis names the failing rank and its error from it), the heartbeat ends with "error" and status.json
        says "crashed" at start-up, so that a watchdog and the validation suite read a run that ended, not one that
        stalled at boot. Rank 0 writes this run's summary.json ("crashed", no step) and timeline.json (the
        milestones it reached) as at the end of every run, so that all three agree: an earlier run's, left for
        --resume, are replaced, and a fresh run has its own. A KeyboardInterrupt (a Ctrl-C before the stop handlers
        are installed, or a second one) is no failure of the run: "terminated" at start-up, the heartbeat ends with
        "stop", and no error file. The exception propagates (nsa.training.cli: exit 2 or 1)."""
        error = f"{type(exc).__name__}: {exc}"
        interrupted = isinstance(exc, KeyboardInterrupt)
        step = max(self.start_step, self.boot_step)  # the step the run had reached (a resume's checkpoint)
        if not interrupted:
            with contextlib.suppress(Exception):  # recording the failure must not hide it
                outputs.write_error(self.out, self.info.rank, exc)
        status = "terminated" if interrupted else "crashed"
        reason = f"start-up: interrupted ({type(exc).__name__})" if interrupted else f"start-up: {error}"
        with contextlib.suppress(Exception):
            if interrupted:
                self.heartbeat.write(step, "stop", reason=reason, phase="start-up")
            else:
                self.heartbeat.write(step, "error", error=error, phase="start-up")
            self.heartbeat.close()
        with contextlib.suppress(Exception):
            self._status(status, reason, step, phase="start-up")
        with contextlib.suppress(Exception):
            self._startup_failure_files(status)
        with contextlib.suppress(Exception):
            self.control.uninstall()

    def _startup_failure_files(self, status: str = "crashed") -> None:
        """summary.json and timeline.json (rank 0) of a run that failed (or was interrupted) at start-up: as
        _finish_files writes them at the end of a run, without the printed block (the error is what is said)."""
        if not self.info.is_main:
            return
        detail = memory_detail_gb(self.device)
        self.summary.set_peaks(detail["peak_alloc"], detail["peak_reserved"])
        outputs.write_json(self.out / outputs.SUMMARY_JSON,
                           self.summary.build(status, self.comm, self.comm_counted_by, self.comm_prediction,
                                              self.memory_prediction))
        self._write_timeline()

    # ------------------------------------------------------------------ setup helpers
    def say(self, message: str, note: bool = True) -> None:
        """Log on rank 0; `note` also keeps it in status.json's notes (settings, warnings)."""
        if self.info.is_main:
            log.info(message)
            if note:
                self.notes.append(message)

    def _compiles(self, during: str = "train") -> bool:
        """Whether the first forward compiles (torch.compile; for "train" also Triton's JIT kernels and their
        autotuning), which can take minutes with no progress point inside: the heartbeat before it says "compiling".
        An evaluation's first forward (eval mode, no gradients) compiles anew under torch.compile only."""
        return self.cfg.train.compile or (during == "train" and self.attention_kernel == "triton")

    def _starting(self, stage: str) -> None:
        """A start-up stage done: a heartbeat that names it (progress, so that a long start-up is not taken for a
        stall, and a start-up that hangs is caught at the stage it hangs after)."""
        self.heartbeat.write(self.boot_step, "starting", stage=stage)

    def _wrap(self, net: NSAModel) -> nn.Module:
        tc, tg = self.cfg.train, self.tg
        model: nn.Module = net
        if self.parallel == "ddp":
            # CUDA graphs: DDP built on the capture's side stream, its gradients views of its buckets (fixed
            # addresses for the graphs); nsa.training.graphs
            with self.capture.side_stream() if self.capture is not None else contextlib.nullcontext():
                model = distributed.wrap_ddp(net, self.info, tg.ddp_bucket_mb, tg.ddp_compress, counter=self.comm,
                                             gradient_as_bucket_view=self.capture is not None)
            self.say(f"[ddp] world size {self.info.world_size}, backend {self.info.backend}, "
                     f"bucket_cap_mb {tg.ddp_bucket_mb}")
            if tg.ddp_compress != "none":
                self.say(f"[ddp] gradient compression enabled: {tg.ddp_compress}")
        elif self.parallel == "fsdp":
            model = distributed.wrap_fsdp(net, reshard_after_forward=tc.fsdp_reshard)
            mode = "full shard" if tc.fsdp_reshard else "no reshard after forward (SHARD_GRAD_OP equivalent)"
            self.say(f"[fsdp] fully_shard per block, {mode}, world size {self.info.world_size}")
        if self.parallel == "none" and tc.parallel in ("ddp", "fsdp"):
            self.say(f"train.parallel={tc.parallel} is ignored: this is a single process (launch it with torchrun "
                     f"--nproc_per_node N for {'DDP' if tc.parallel == 'ddp' else 'FSDP2'})")
        if self.parallel != "ddp" and tg.ddp_compress != "none":
            self.say(f"NSA_DDP_COMPRESS={tg.ddp_compress} is ignored: the run is not DDP")
        if self.parallel != "fsdp" and not tc.fsdp_reshard:
            self.say("train.fsdp_reshard=false is ignored: the run is not FSDP2")
        self.timeline.mark("model_wrapped")
        if tc.compile:
            prepare_compile()  # the selected branch's PyTorch path stays eager under torch.compile
            model = torch.compile(model, backend=tc.compile_backend)
            self.timeline.mark("compiled")
            self.say(f"torch.compile enabled, backend {tc.compile_backend} (compilation happens during the first "
                     f"forward)")
        elif tc.compile_backend != "inductor":
            self.say(f"train.compile_backend={tc.compile_backend} is ignored: the model is not compiled (--compile)")
        return model

    def _fault_notes(self) -> None:
        """Say when NSA_FAULT is a step fault this run never reaches (its step outside the run, its rank absent), a
        model fault (nsa.toggles.MODEL_FAULT_KINDS) and whether it can bite here, or a slowdown of every step
        (slow_step)."""
        fault = self.tg.fault
        if fault is not None and fault.step is not None:  # a step fault this run never reaches does nothing: said
            tc, world = self.cfg.train, self.info.world_size
            where = f"{fault.kind}@{fault.step}" + ("" if fault.rank is None else f":{fault.rank}")
            if not self.start_step < fault.step <= tc.steps:
                self.say(f"NSA_FAULT={where} will not fire: this run trains steps {self.start_step + 1} to "
                         f"{tc.steps}")
            elif fault.rank is not None and fault.rank >= world:
                self.say(f"NSA_FAULT={where} will not fire: there is no rank {fault.rank} (world size {world})")
            return
        if fault is not None and fault.kind == "slow_step":
            self.say(f"NSA_FAULT=slow_step@{fault.share:g} (a testing aid): every step sleeps {fault.share:.0%} of its "
                     f"own time, so tokens/s is {fault.share / (1 + fault.share):.0%} lower")
            return
        if fault is None or fault.kind not in toggles.MODEL_FAULT_KINDS:
            return
        # in the layers (NSA attention, selection v1: model_faults.install), and on their batched PyTorch path
        active = self.model_faults > 0 and self.attention_kernel == "torch"
        short = self.cfg.train.seq_len <= fault.seq_len  # every forward of this run is that short
        self.say(f"NSA_FAULT={fault.kind}@{fault.seq_len} (a testing aid): selection v1 does O(seq_len^2) extra work "
                 f"above {fault.seq_len} tokens" + (
                     "; it has no effect here (it needs NSA attention, batched prefill, selection v1 and torch "
                     "kernels)" if not active else
                     f"; it has no effect here (this run's sequences are {self.cfg.train.seq_len} tokens)" if short
                     else ""))

    def _tensorboard(self):
        if self.tg.tb_disable:
            return None
        try:
            # optional dependency (and ~0.2 s of imports): loaded only when TensorBoard scalars are written
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            self.say("TensorBoard scalars skipped: the tensorboard package is not installed "
                     "(pip install tensorboard, or set NSA_TB_DISABLE=1)")
            return None
        return SummaryWriter(str(self.out / "tb"))

    def _status(self, status: str, reason: str | None, step: int, **extra) -> None:
        if self.info.is_main:
            outputs.write_json(self.out / outputs.STATUS_JSON, {
                "status": status, "reason": reason, "step": step, "steps_planned": self.cfg.train.steps,
                "checkpoint_step": checkpoint.latest_step(self.out),
                "world_size": self.info.world_size, "parallel": self.parallel, "updated": time.time(),
                "notes": self.notes, **extra})

    def _last_good(self) -> str:
        """Where a run stopped on a non-finite loss or gradient continues from. It writes no checkpoint of its own:
        its parameters passed no check since their last update (a non-finite loss may come from them), so the
        latest checkpoint, written after a step that was checked finite, stays the one --resume takes."""
        last = checkpoint.latest_step(self.out)
        if last is None:
            return "there is no checkpoint: --resume starts again at step 0"
        return f"the last good checkpoint is step {last}: --resume continues from it"

    # ------------------------------------------------------------------ one step
    def _autocast(self):
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        # autocast's cache of cast weights is not graph-safe (torch.cuda.graphs): off under CUDA graphs
        return torch.autocast(self.device.type, dtype=self.amp_dtype, cache_enabled=not self.cfg.train.cuda_graphs)

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _no_sync(self, last: bool):
        """Skip the gradient all-reduce on all but the last micro-batch."""
        if last:
            return contextlib.nullcontext()
        if self.parallel == "ddp":
            return self.model.no_sync()
        return contextlib.nullcontext()

    def _grad_norm(self) -> torch.Tensor:
        max_norm = self.cfg.train.grad_clip if self.cfg.train.grad_clip > 0 else math.inf
        counting = (comm_count.functional_collectives(self.comm) if self.parallel == "fsdp" and self.comm is not None
                    else contextlib.nullcontext())  # FSDP2: DTensor reduces the norm across ranks
        with counting:
            norm = torch.nn.utils.clip_grad_norm_(self.net.parameters(), max_norm)
            if hasattr(norm, "full_tensor"):
                norm = norm.full_tensor()
        return norm

    def train_step(self, step: int, record_stats: bool) -> dict[str, Any]:
        tc = self.cfg.train
        fault = self.control.fault_at(step)
        if fault == "crash":
            self.control.crash(step)
        if fault == "hang":
            self.heartbeat.write(step, "fault", kind="hang")
            self.control.hang(step)
        lr = lr_at(step, lr=tc.lr, warmup_steps=tc.warmup_steps, schedule=tc.lr_schedule,
                   decay_steps=decay_length(tc.decay_steps, tc.steps, tc.warmup_steps), min_lr_ratio=tc.min_lr_ratio)
        set_lr(self.optimizer, lr)
        if self.graphed is not None:  # the same step, replayed (nsa.training.graphs)
            batches = [self.source.next_batch() for _ in range(tc.accum)]
            loss_sum, grad_norm = self.graphed.step(batches, nan=fault == "nan")
            return {"lr": lr, "loss_sum": loss_sum, "grad_norm": grad_norm}
        if self.parallel == "fsdp":
            self.model.set_requires_gradient_sync(True)
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        for micro in range(tc.accum):
            last = micro == tc.accum - 1
            if self.parallel == "fsdp":
                self.model.set_requires_gradient_sync(last)
            inputs, targets = self.source.next_batch()
            inputs, targets = inputs.to(self.device, non_blocking=True), targets.to(self.device, non_blocking=True)
            self.net.set_record_stats(record_stats and last)
            loss_sum += self._micro_step(inputs, targets, last, float("nan") if fault == "nan" else None).double()
        self.net.set_record_stats(False)
        if self.scaler:
            self.scaler.unscale_(self.optimizer)
        grad_norm = self._grad_norm()
        return {"lr": lr, "loss_sum": loss_sum, "grad_norm": grad_norm}

    def _loss(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The mean next-token cross entropy as model.loss (NSA_LOSS) says: chunked or fused, the model's forward
        fuses its head with the loss (nsa.loss); the reference, lm_loss of the logits, outside the (compiled,
        wrapped) model."""
        if resolve_loss(self.model_cfg.loss) != "reference":
            return self.model(inputs, targets)
        return lm_loss(self.model(inputs), targets)

    def _micro_step(self, inputs: torch.Tensor, targets: torch.Tensor, last: bool, loss_factor=None) -> torch.Tensor:
        """One micro-batch's forward and backward (gradients summed over the step's micro-batches); its detached
        loss. loss_factor: multiplies the loss (NaN: the NSA_FAULT=nan testing aid; a tensor under CUDA graphs)."""
        with self._no_sync(last):
            with self._autocast():
                loss = self._loss(inputs, targets)
            if not self.timeline.has("first_forward"):
                self._sync()
                self.timeline.mark("first_forward")
            if loss_factor is not None:
                loss = loss * loss_factor
            scaled = loss / self.cfg.train.accum
            (self.scaler.scale(scaled) if self.scaler else scaled).backward()
        return loss.detach()

    # ------------------------------------------------------------------ loop
    def run(self) -> int:
        self.control.install()  # first: the gap since the start-up's handlers were uninstalled stays short
        tc, info = self.cfg.train, self.info
        tokens_per_step = info.world_size * tc.batch_size * tc.accum * tc.seq_len
        self.say(f"model: {self.n_params / 1e6:.2f}M parameters, {self.flops_per_token / 1e9:.3f} GFLOP/token "
                 f"(training, seq {tc.seq_len}); {self.parallel} x {info.world_size} on {device_name(self.device)}; "
                 f"{tokens_per_step} tokens/step; out_dir {self.out}")
        status, reason, code = "completed", None, EXIT_OK
        step = self.start_step
        done = self.start_step  # the last step whose row was recorded (a KeyboardInterrupt may cut the next short)
        profiler = metrics.profiler(tc, self.device, self.out, self.info.rank, first_step=self.start_step)
        # FSDP2's collectives are counted by wrappers installed for this loop only (DDP's by its comm hook)
        counting = (comm_count.patch_collectives(self.comm) if self.parallel == "fsdp"
                    else contextlib.nullcontext())
        self.timeline.mark("setup_done")
        try:
            with observability.sdpa_backends(self.tg.sdpa_flash_only, self.tg.sdpa_no_flash), \
                    profiler or contextlib.nullcontext(), counting:
                if self.graphed is not None:
                    self._capture_graphs(step)
                elif self._compiles() and step < tc.steps:
                    # the first step's forward compiles (torch.compile, Triton's JIT and autotuning): one long call
                    self.heartbeat.write(step, "compiling", during="train")
                while step < tc.steps:
                    step += 1
                    self.control.step = step
                    aux = not self.tg.aux_stats_disable and (step % tc.log_every == 0 or step == 1 or step == tc.steps)
                    self._sync()
                    if self.comm is not None:
                        self.comm.begin_step()
                    t0 = time.perf_counter()
                    with observability.span("nsa.step"):
                        out = self.train_step(step, aux)
                    grad_norm = float(out["grad_norm"])
                    local_loss_bad = not math.isfinite(float(out["loss_sum"]))
                    # fp16: an inf/NaN gradient is the GradScaler's business (it skips the step and backs off)
                    local_grad_bad = not math.isfinite(grad_norm) and self.scaler is None
                    loss_total, n_bad_loss, n_bad_grad, n_halt, n_term = distributed.all_reduce_sum(
                        [0.0 if local_loss_bad else float(out["loss_sum"]), float(local_loss_bad),
                         float(local_grad_bad), float(self.control.halt_requested()),
                         float(self.control.stop_signal is not None)], info, counter=self.comm)
                    if n_bad_loss or n_bad_grad:
                        if self.comm is not None:
                            self.comm.discard_step()
                        self.optimizer.zero_grad(set_to_none=True)
                        status, code = "nonfinite", EXIT_NONFINITE
                        what = (f"non-finite loss on {int(n_bad_loss)} of {info.world_size} rank(s)" if n_bad_loss
                                else "non-finite gradient norm (loss finite)")
                        reason = (f"{what} at step {step}; the optimizer step was skipped and training stopped "
                                  f"without a checkpoint; {self._last_good()}")
                        self.heartbeat.write(step, "stop", reason=reason, local_loss=float(out["loss_sum"]) / tc.accum)
                        step -= 1
                        break
                    with observability.span("nsa.optim"):
                        if self.graphed is not None:  # the next step graph writes the gradients afresh
                            self.graphed.optimizer_step()
                        elif self.scaler:
                            self.scaler.step(self.optimizer)
                            self.scaler.update()
                            self.optimizer.zero_grad(set_to_none=True)
                        else:
                            self.optimizer.step()
                            self.optimizer.zero_grad(set_to_none=True)
                    self._sync()
                    self.control.slow_step(time.perf_counter() - t0)  # NSA_FAULT=slow_step@SHARE (a testing aid)
                    dt = time.perf_counter() - t0
                    self.timeline.mark("first_optimizer_step")
                    comm = self.comm.end_step() if self.comm is not None else None
                    loss = loss_total / (tc.accum * info.world_size)
                    self._record(step, loss, out["lr"], grad_norm, dt, tokens_per_step,
                                 float(out["loss_sum"]) / tc.accum, aux, comm)
                    done = step
                    if step == self.start_step + 1:
                        self.timeline.mark("first_logged_step")
                        self._write_timeline(gather=True)
                    if profiler is not None:
                        profiler.step()
                    if self.eval_source is not None and (step % tc.eval_every == 0 or step == tc.steps):
                        self._evaluate(step)
                    if n_halt or n_term:
                        status = "halted" if n_halt else "terminated"
                        reason = (self.control.halt_reason() if n_halt
                                  else f"{self.control.stop_signal or 'signal'} received")
                        # not terminal yet: the checkpoint below runs collectives, and a rank that hangs there
                        # must read as silent to a watchdog, not as a run that ended ("stop" comes last, below)
                        self.heartbeat.write(step, "stopping", reason=reason)
                        self._save(step)
                        break
                    if step % tc.save_every == 0:
                        self._save(step)
            if status != "nonfinite" and self.last_saved != step:
                self._save(step)  # a second Ctrl-C here ends the run at once, as in the loop's own stop (below)
            # the run's last records from here on (its files closed, status.json, summary.json, the heartbeat's last
            # line): a signal now is held, not acted on (RunControl.hold), a second Ctrl-C too, so that they end
            # complete and the run ends as its loop decided
            self.control.hold()
        except KeyboardInterrupt as exc:
            # a second Ctrl-C (the first asked for a stop), or one before the handlers caught it: no failure of the
            # run, as at start-up (_setup_failed): "terminated", summary.json says so too, the heartbeat ends with
            # "stop", and no error file (the validation suite's diagnosis would name a failing rank). No checkpoint
            # of the step it cut short (its parameters, optimizer state or data position may be half-way, and the
            # other ranks are not in step to save one): the latest complete one is where --resume continues. The
            # interrupt propagates, as at start-up: the process ends by SIGINT (nsa.training.cli does not catch it)
            latest = None
            with contextlib.suppress(Exception):  # recording the stop must not hide the interrupt
                latest = checkpoint.latest_step(self.out)
            reason = (f"interrupted ({type(exc).__name__}) " + (f"after step {done}" if done == step else
                                                                f"during step {step}")
                      + ("; no checkpoint: --resume starts again at step 0" if latest is None else
                         f"; the latest checkpoint is step {latest}: --resume continues from it"))
            with contextlib.suppress(Exception):
                self.heartbeat.write(done, "stop", reason=reason)
                self.heartbeat.close()
            with contextlib.suppress(Exception):
                self._status("terminated", reason, done)
            with contextlib.suppress(Exception):
                self._finish_files("terminated")
            with contextlib.suppress(Exception):
                self.control.uninstall()
            raise
        except BaseException as exc:
            # each record best effort, as at start-up (_setup_failed): one that fails (status.json on the full disk
            # that failed the checkpoint) must neither hide the failure (nsa.training.cli says which it was) nor
            # keep the others (the heartbeat's "error", the error file) from being written
            failure, error = exc, f"{type(exc).__name__}: {exc}"
            records = (("status.json", lambda: self._status("crashed", error, step)),
                       ("summary.json / timeline.json", lambda: self._finish_files("crashed")),
                       (f"heartbeat_rank{info.rank}.jsonl", lambda: self.heartbeat.write(step, "error", error=error)),
                       (None, self.heartbeat.close),
                       (f"error_rank{info.rank}.txt", lambda: outputs.write_error(self.out, info.rank, failure)),
                       (None, self.control.uninstall))
            for what, record in records:
                try:
                    record()
                except Exception as record_exc:  # noqa: BLE001 - said, never raised over the run's own failure
                    if what is not None:
                        log.warning(f"{what} not written after the crash: {type(record_exc).__name__}: {record_exc}")
            raise
        finally:
            self._close()
        # the signal handlers stay, holding every SIGTERM, SIGINT and SIGHUP, until the run's last record is written,
        # where a second Ctrl-C would cut these writes short (status.json still "running", no summary)
        try:
            if self.audit is not None:
                summary = self.audit.summary()
                outputs.write_json(self.out / outputs.SDPA_AUDIT_JSON, summary)
                sites = "; ".join(f"{r['site']}: {r['backend']} x{r['calls']} ({r['device']}, {r['dtype']})"
                                  for r in summary["by_site"])
                self.say(f"[sdpa-audit] {summary['calls']} calls: {sites or 'none'}", note=False)
            self._status(status, reason, step)
            self._finish_files(status)
            if status != "nonfinite":
                digest = checkpoint.param_digest(self.net) if self.parallel != "fsdp" else None  # FSDP: shards differ
                self.heartbeat.write(step, "done" if status == "completed" else "stop", status=status,
                                     params_sha256=digest, **({"reason": reason} if reason else {}))
            self.heartbeat.close()
        finally:
            self.control.uninstall()
        if self.control.held:
            self.say(f"{', '.join(self.control.held)} received while the run's last records were written: held "
                     "until they were complete", note=False)
        self.say(f"{status} at step {step}" + (f": {reason}" if reason else ""))
        return code

    def _capture_graphs(self, step: int) -> None:
        """Warm up and capture the train step (nsa.training.graphs), inside the loop's SDPA-backend and profiler
        contexts so that the captured kernels are the ones the loop would run."""
        self.heartbeat.write(step, "capturing")  # warm-up steps and the capture: one long call (LONG_CALL_MSGS)
        info = self.graphed.capture()
        self.heartbeat.write(step, "cuda_graphs", **info)
        self.say(f"CUDA graphs: train step captured after {info['warmup_steps']} warm-up steps on a side stream "
                 f"({info['capture_s']:.2f} s); each step replays the step graph, then the optimizer graph")

    def _record(self, step, loss, lr, grad_norm, dt, tokens_per_step, local_loss, aux, comm=None) -> None:
        tc = self.cfg.train
        mem_alloc, mem_reserved = memory_gb(self.device)
        tps = tokens_per_step / dt
        row = {"step": step, "loss": loss, "lr": lr, "toks_per_s": tps, "step_time_s": dt, "grad_norm": grad_norm,
               "mem_alloc_gb": mem_alloc, "mem_reserved_gb": mem_reserved,
               "comm_bytes": self.comm.step_bytes(comm) if comm is not None else 0,
               "comm_time_s": (comm["time_s"] if comm is not None
                               else (0.0 if self.device.type != "cuda" else None))}
        if self.info.is_main:
            detail = memory_detail_gb(self.device)
            self.summary.add(step, dt, tps, loss, detail["alloc"], detail["reserved"])
        util = mfu(self.flops_per_token, tps, self.info.world_size, self.peak)
        if util is not None:
            row["mfu"] = util
            if util > 1 and not self._impossible_mfu_said:  # once: the figure is written as measured
                self._impossible_mfu_said = True
                self.say(f"mfu {util:.2f} at step {step} is above 1, which no device does: the peak it is divided by "
                         f"({self.peak / 1e12:g} TFLOP/s{', train.peak_tflops' if tc.peak_tflops else ''}) is below "
                         "this device's; set train.peak_tflops to its dense peak")
        stats = self.net.aux_stats() if aux else {}
        self.heartbeat.write(step, "step", loss=loss, local_loss=local_loss, toks_per_s=tps, step_time_s=dt,
                             grad_norm=grad_norm, mem_alloc_gb=mem_alloc, **stats)
        if self.csv is not None:
            self.csv.write(row)
            self._csv_fault(step)
        if self.tb is not None:
            for key in ("loss", "lr", "toks_per_s", "grad_norm", "mem_alloc_gb", "mfu"):
                if key in row:
                    self.tb.add_scalar(f"train/{key}", row[key], step)
            for key, value in stats.items():
                self.tb.add_scalar(f"aux/{key}", value, step)
        if self.info.is_main and (step % tc.log_every == 0 or step == 1 or step == tc.steps):
            extra = f" | mfu {util * 100:.1f}%" if util is not None else ""
            gates = " | gates " + "/".join(f"{stats[k]:.2f}" for k in ("gate_cmp", "gate_sel", "gate_win")) \
                if "gate_cmp" in stats else ""
            log.info(f"step {step}/{tc.steps} | loss {loss:.4f} | lr {lr:.2e} | {tps:,.0f} tok/s | {dt:.3f} s/step"
                     f" | grad {grad_norm:.3f} | mem {mem_alloc:.2f}/{mem_reserved:.2f} GiB{extra}{gates}")
        if self.audit is not None and step % tc.log_every == 0:
            outputs.write_json(self.out / outputs.SDPA_AUDIT_JSON, self.audit.summary())

    def _write_timeline(self, gather: bool = False) -> None:
        """timeline.json (rank 0). gather: every rank's milestones too (a collective: all ranks call it, in step)."""
        marks = dict(self.timeline.marks)
        per_rank = None
        if gather:
            per_rank = [marks]
            if self.info.distributed:
                per_rank = [None] * self.info.world_size
                dist.all_gather_object(per_rank, marks)
            self._timeline_ranks = per_rank
        per_rank = self._timeline_ranks
        if not self.info.is_main:
            return
        outputs.write_json(self.out / outputs.TIMELINE_JSON,
                           timeline.document(self.timeline, per_rank, self.info.world_size))

    def _finish_files(self, status: str) -> None:
        """summary.json and timeline.json (rank 0) at the end of a run, whatever its end; prints the summary.
        Best effort after a crash: a failure here must not hide the crash."""
        if not self.info.is_main:
            return
        try:
            detail = memory_detail_gb(self.device)
            self.summary.set_peaks(detail["peak_alloc"], detail["peak_reserved"])
            summary = self.summary.build(status, self.comm, self.comm_counted_by, self.comm_prediction,
                                         self.memory_prediction)
            outputs.write_json(self.out / outputs.SUMMARY_JSON, summary)
            self._write_timeline()
        except Exception as exc:  # noqa: BLE001 - reported, never raised over the run's own outcome
            if status != "crashed":
                raise
            log.warning(f"summary.json / timeline.json not written after the crash: {type(exc).__name__}: {exc}")
            return
        log.info("\n" + format_summary(summary))

    def _csv_fault(self, step: int) -> None:
        """NSA_FAULT=csv_*@STEP (a testing aid): damage training.csv after this step's row (nsa.training.safety)."""
        kind = self.control.fault_at(step)
        if kind not in toggles.CSV_FAULT_KINDS:
            return
        stops = kind in CSV_FAULTS_STOPPING_WRITER
        if stops:
            self.csv.close()
        damage_training_csv(self.csv.path, kind)
        self.heartbeat.write(step, "fault", kind=kind)
        log.warning(f"NSA_FAULT: {kind} at step {step}: training.csv damaged on purpose"
                    + ("; no more rows are written" if stops else ""))
        if stops:
            self.csv = None

    def _evaluate(self, step: int) -> None:
        tc = self.cfg.train
        self.model.eval()
        total = 0.0
        # progress at every batch: an evaluation longer than a watchdog's stall threshold is not taken for a stall,
        # and one that hangs still is (its last record names the batch it hangs after)
        self.heartbeat.write(step, "eval", batch=0, batches=tc.eval_batches)
        with torch.no_grad(), self._autocast():
            for i in range(tc.eval_batches):
                if i == 0 and not self._eval_compiled and self._compiles("eval"):
                    # the first forward in eval mode without gradients compiles anew: one long call
                    self.heartbeat.write(step, "compiling", during="eval")
                inputs, targets = self.eval_source.next_batch()
                total += float(self._loss(inputs.to(self.device), targets.to(self.device)))
                self._eval_compiled = True
                self.heartbeat.write(step, "eval", batch=i + 1, batches=tc.eval_batches)
        self.model.train()
        if self.parallel == "fsdp":  # as a training step leaves them: sharded (distributed.reshard_fsdp says why)
            distributed.reshard_fsdp(self.net)
        self.eval_source.reset()
        (summed,) = distributed.all_reduce_sum([total], self.info)
        val = summed / (tc.eval_batches * self.info.world_size)
        self.heartbeat.write(step, "eval", batch=tc.eval_batches, batches=tc.eval_batches, val_loss=val)
        if self.val_csv is not None:
            self.val_csv.write({"step": step, "val_loss": val, "val_ppl": perplexity(val)})
            if self.tb is not None:
                self.tb.add_scalar("val/loss", val, step)
            log.info(f"eval step {step}: val_loss {val:.4f}")

    def _save(self, step: int) -> None:
        """A checkpoint of `step` (collective). A write that fails on any rank raises checkpoint.CheckpointError on
        every rank, naming that rank's error (checkpoint.save), and the run ends "crashed" with its earlier
        checkpoints as they were."""
        # one long call (heartbeat.LONG_CALL_MSGS): no progress point inside it; "checkpoint" once it is complete
        self.heartbeat.write(step, "saving")
        path = checkpoint.save(self.out, step, self.net, self.optimizer, self.info,
                               data_state=self.source.state_dict(), scaler=self.scaler, parallel=self.parallel,
                               keep=self.cfg.train.keep_checkpoints)
        self.last_saved = step
        self.heartbeat.write(step, "checkpoint", path=str(path))
        self.say(f"checkpoint: {path}", note=False)

    def _close(self) -> None:
        for thing in (self.csv, self.val_csv, self.tb):
            if thing is not None:
                thing.close()
        self.source.close()
        if self.eval_source is not None:
            self.eval_source.close()
        observability.configure(nvtx=False, audit=None)
