"""The trainer's evaluation (val.csv) and its run-config loading.

Evaluation: val_loss against a float64 recomputation from the checkpointed weights of the evaluated step and the
evaluation source's own batches (held out from the training samples), val_ppl against exp(val_loss), and a resume's
val.csv. Config: the documented one-line errors naming the file and key, and a key given twice.
"""

from __future__ import annotations

import csv
import math
import shutil
import types
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml

from nsa.model import NSAModel
from nsa.training import cli, outputs
from nsa.training import trainer as trainer_module
from nsa.training.config import ConfigError, config_from_dict, load_config
from nsa.training.data import build_eval_source, build_source
from nsa.training.distributed import DistInfo

REPO = Path(__file__).resolve().parents[3]
TINY = REPO / "configs" / "tiny_cpu.yaml"
STEPS, EVAL_BATCHES = 2, 2


def _tiny(**train) -> dict:
    raw = yaml.safe_load(TINY.read_text())
    raw["train"].update(train)
    return raw


def _write(tmp_path: Path, raw=None, text: str | None = None, name: str = "run.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text if text is not None else yaml.safe_dump(raw, sort_keys=False))
    return path


def _read_csv(path: Path) -> list[dict]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


# ------------------------------------------------------------------------------------------------ evaluation runs
@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A 2-step tiny run evaluating after every step, a checkpoint at every step (the weights each row evaluated)."""
    root = tmp_path_factory.mktemp("eval_run")
    cfg = _write(root, _tiny(steps=STEPS, seq_len=32, batch_size=1, eval_every=1, eval_batches=EVAL_BATCHES,
                             save_every=1, keep_checkpoints=10, warmup_steps=0, log_every=1))
    out = root / "out"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("NSA_TB_DISABLE", "1")
        assert cli.main(["--config", str(cfg), "--out-dir", str(out)]) == 0
    return cfg, out


def _f64_eval_loss(cfg_path: Path, ckpt: Path) -> float:
    """Mean over the evaluation batches of the mean next-token cross entropy, in float64, of the checkpoint's
    weights: the model rebuilt from the config, the batches from build_eval_source (rank 0 of 1)."""
    cfg = load_config(cfg_path)
    tc = cfg.train
    source = build_eval_source(cfg.data, vocab_size=cfg.model.vocab_size, seq_len=tc.seq_len,
                               batch_size=tc.batch_size, rank=0, world_size=1, seed=tc.seed)
    model = NSAModel(cfg.model)
    state = torch.load(ckpt / "model_optim.pt", map_location="cpu", weights_only=False)["model"]
    model.load_state_dict(state)
    model = model.double().eval()
    losses = []
    with torch.no_grad():
        for _ in range(tc.eval_batches):
            x, y = source.next_batch()
            losses.append(F.cross_entropy(model(x).flatten(0, 1), y.flatten(), reduction="mean").item())
    return sum(losses) / len(losses)


def test_val_loss_is_the_float64_loss_of_the_evaluated_steps_weights_on_fixed_held_out_batches(run):
    cfg_path, out = run
    rows = _read_csv(out / outputs.VAL_CSV)
    assert [int(r["step"]) for r in rows] == list(range(1, STEPS + 1))
    for row in rows:
        step = int(row["step"])
        want = _f64_eval_loss(cfg_path, out / "checkpoints" / f"step_{step:08d}")
        assert float(row["val_loss"]) == pytest.approx(want, abs=2e-6), step  # val.csv keeps 6 decimals
        assert float(row["val_ppl"]) == pytest.approx(math.exp(want), rel=1e-5)
    # the evaluation samples are none of the samples trained on
    cfg = load_config(cfg_path)
    tc = cfg.train
    args = dict(vocab_size=cfg.model.vocab_size, seq_len=tc.seq_len, batch_size=tc.batch_size, rank=0,
                world_size=1, seed=tc.seed)
    trained = {tuple(torch.cat([x[i], y[i, -1:]]).tolist())
               for x, y in (build_source(cfg.data, **args).next_batch() for _ in range(STEPS * tc.accum))
               for i in range(tc.batch_size)}
    source = build_eval_source(cfg.data, **args)
    held_out = {tuple(torch.cat([x[i], y[i, -1:]]).tolist())
                for x, y in (source.next_batch() for _ in range(tc.eval_batches)) for i in range(tc.batch_size)}
    assert len(held_out) == tc.eval_batches * tc.batch_size and not held_out & trained


def test_a_resume_with_evaluation_off_drops_the_val_rows_after_its_checkpoint(run, tmp_path, monkeypatch):
    """A run that wrote step 2's evaluation and died before step 2's checkpoint, resumed from step 1 with evaluation
    off: val.csv keeps the rows up to step 1 only, as training.csv does (step 2's row evaluated weights the resumed
    run no longer has). It kept the dead run's row for step 2."""
    cfg_path, done = run
    out = tmp_path / "out"
    shutil.copytree(done, out)
    shutil.rmtree(out / "checkpoints" / f"step_{STEPS:08d}")  # the run died before saving step 2
    monkeypatch.setenv("NSA_TB_DISABLE", "1")
    assert cli.main(["--config", str(cfg_path), "--out-dir", str(out), "--resume", "--eval-every", "0",
                     "--steps", "1"]) == 0  # resumed at step 1 of 1: nothing left to train
    assert [int(r["step"]) for r in _read_csv(out / outputs.TRAINING_CSV)] == [1]
    assert [int(r["step"]) for r in _read_csv(out / outputs.VAL_CSV)] == [1]


class _Rows:
    def __init__(self):
        self.rows = []

    def write(self, row):
        self.rows.append(dict(row))


@pytest.mark.parametrize("loss, ppl", [(2.0, 7.38905609893065), (60.0, 1.1420073898156842e26),
                                       (800.0, math.inf)])
def test_val_ppl_is_exp_of_val_loss_beyond_50_nats(loss, ppl):
    """val.csv's val_ppl is exp(val_loss) (outputs.VAL_COLUMNS); a diverged model's 60 nats read 5.18e21, the
    exponential of 50, not 1.14e26; past the float range it is inf."""
    rows = _Rows()
    batches = [(torch.zeros(1, 4, dtype=torch.long), torch.zeros(1, 4, dtype=torch.long))] * 3
    source = types.SimpleNamespace(pos=0, reset=lambda: None)

    def next_batch():
        source.pos += 1
        return batches[source.pos - 1]

    source.next_batch = next_batch
    stub = types.SimpleNamespace(
        cfg=types.SimpleNamespace(train=types.SimpleNamespace(eval_batches=3)), model=torch.nn.Linear(1, 1),
        eval_source=source, _autocast=lambda: torch.autocast("cpu", enabled=False),
        _loss=lambda x, y: torch.tensor(loss), parallel="none",
        info=DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), backend=None),
        device=torch.device("cpu"), val_csv=rows, tb=None,
        # the evaluation's progress heartbeats (one per batch) and its first compiled forward: none here
        heartbeat=types.SimpleNamespace(write=lambda *args, **kwargs: None), _eval_compiled=True,
        _compiles=lambda during="train": False)
    trainer_module.Trainer._evaluate(stub, 5)
    (row,) = rows.rows
    assert row["step"] == 5 and row["val_loss"] == pytest.approx(loss)
    assert row["val_ppl"] == pytest.approx(ppl, rel=1e-12)


# ------------------------------------------------------------------------------------------------ config loading
def _error(path: Path, *named: str) -> str:
    with pytest.raises(ConfigError) as err:
        load_config(path)
    message = str(err.value)
    assert message.startswith(f"{path}: ") and "\n" not in message, message
    for part in named:
        assert part in message, (part, message)
    return message


@pytest.mark.parametrize("train, named", [
    ({"stepz": 3}, ("'train.stepz'", "unknown key")),
    ({"steps": "10"}, ("'train.steps'", "must be an integer", "'10'")),
    ({"steps": 0}, ("train.steps", "must be positive")),
    ({"steps": -5}, ("train.steps", "must be positive", "-5")),
    ({"eval_batches": 0, "eval_every": 5}, ("train.eval_batches", "must be positive")),
    ({"eval_every": -1}, ("train.eval_every", ">= 0")),
    ({"eval_every": 2.0}, ("'train.eval_every'", "must be an integer")),
], ids=["unknown", "string", "zero", "negative", "eval_batches_0", "eval_every_negative", "eval_every_float"])
def test_a_bad_train_key_is_one_line_naming_the_file_and_key(tmp_path, train, named):
    _error(_write(tmp_path, _tiny(**train)), *named)


def test_eval_every_past_the_run_is_accepted():
    """Not an error: the trainer evaluates the last step whatever eval_every is (test_resume_exactness: rows at
    steps 2, 4, 6 and 7 of 7 with eval_every 2)."""
    assert config_from_dict(_tiny(steps=10, eval_every=100)).train.eval_every == 100


@pytest.mark.parametrize("text", ["", "# only a comment\n", "- model\n- train\n", "just text\n"],
                         ids=["empty", "comment", "list", "scalar"])
def test_a_config_that_is_not_a_mapping_is_refused(tmp_path, text):
    _error(_write(tmp_path, text=text), "expected a mapping with sections model, train, data")


def test_a_key_given_twice_is_refused_naming_both_lines(tmp_path):
    """PyYAML keeps the last of two equal keys: a second `train:` replaced the whole first section (steps 60 -> 3,
    and seq_len, batch_size, lr, ... back to their defaults) and a repeated key dropped a value, without a word."""
    text = TINY.read_text()
    lines = text.splitlines()
    first_train = lines.index("train:") + 1
    twice = _write(tmp_path, text=text + "train:\n  steps: 3\n", name="twice.yaml")
    _error(twice, "duplicate key 'train'", f"at line {len(lines) + 1}", f"first at line {first_train}")
    steps_line = next(i for i, line in enumerate(lines, 1) if line.startswith("  steps:"))
    repeated = _write(tmp_path, text=text.replace("  steps: 60\n", "  steps: 60\n  steps: 6\n"), name="repeat.yaml")
    _error(repeated, "duplicate key 'train.steps'", f"at line {steps_line + 1}", f"first at line {steps_line}")
    # a merge key beside the keys it merges, and an alias, are not duplicates
    merged = _write(tmp_path, name="merged.yaml", text=text.replace(
        "model:\n  vocab_size: 256\n", "model:\n  <<: {vocab_size: 128, dim: 64}\n  vocab_size: 256\n"))
    assert load_config(merged).model.vocab_size == 256


def test_a_config_file_that_cannot_be_read_is_a_config_error(tmp_path, monkeypatch, capsys):
    """A file that exists but cannot be read (no permission, an I/O error) is one line naming it, exit 2; it was a
    PermissionError traceback (exit 1) from nsa-train."""
    path = _write(tmp_path, _tiny())
    real = Path.read_text

    def read_text(self, *args, **kwargs):
        if self == path:
            raise PermissionError(13, "Permission denied", str(path))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", read_text)
    _error(path, "cannot read", "Permission denied")
    assert cli.main(["--config", str(path), "--out-dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("nsa-train: error: ") and str(path) in err and "\n" not in err, err
