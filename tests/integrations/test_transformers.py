"""ExprTrackerCallback with a real Hugging Face Trainer on the CPU: a 2-layer tiny BERT built from
a config (no download), random tensors, ~10 optimizer steps; the rows, steps, config and
final status on disk."""

from __future__ import annotations

import json
import logging
import os
import textwrap
from types import SimpleNamespace

import pytest
from helpers import ROOT, read_lines, run_py

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("accelerate")  # Trainer needs it

import torch  # noqa: E402
from transformers import (  # noqa: E402
    BertConfig,
    BertForSequenceClassification,
    Trainer,
    TrainingArguments,
)

import expr_tracker as et  # noqa: E402
from expr_tracker.integrations.transformers import ExprTrackerCallback  # noqa: E402
from expr_tracker.spec import SpecError  # noqa: E402

pytestmark = pytest.mark.slow  # a Trainer run takes seconds (transformers' import alone ~5 s)

OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "WANDB_DISABLED": "true"}


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    for k, v in OFFLINE.items():
        monkeypatch.setenv(k, v)


class RandomTokens(torch.utils.data.Dataset):
    """``n`` sequences of 8 random token ids with a random binary label."""

    def __init__(self, n: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, 100, (n, 8), generator=g)
        self.labels = torch.randint(0, 2, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {
            "input_ids": self.ids[i],
            "attention_mask": torch.ones(8, dtype=torch.long),
            "labels": self.labels[i],
        }


def tiny_bert() -> BertForSequenceClassification:
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=100,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
    )
    return BertForSequenceClassification(config)


def training_args(tmp_path, **overrides) -> TrainingArguments:
    values = dict(
        output_dir=str(tmp_path / "out"),
        report_to="none",
        max_steps=10,
        logging_steps=2,
        eval_strategy="steps",
        eval_steps=5,
        per_device_train_batch_size=4,
        per_device_eval_batch_size=8,
        save_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
        seed=0,
    )
    values.update(overrides)
    return TrainingArguments(**values)


def trainer(tmp_path, callback, trainer_cls=Trainer, **overrides) -> Trainer:
    return trainer_cls(
        model=tiny_bert(),
        args=training_args(tmp_path, **overrides),
        train_dataset=RandomTokens(64, 0),
        eval_dataset=RandomTokens(16, 1),
        callbacks=[callback],
    )


def rows_by_step(run_dir) -> dict[int, dict]:
    return {r["_step"]: r for r in et.read_history(run_dir)}


def status_of(run_dir) -> str:
    return json.loads((run_dir / "run.json").read_text())["status"]


def test_rows_steps_config_and_final_status(tmp_path):
    cb = ExprTrackerCallback(project="hf", name="r1", spec={"tags": ["tiny"]})
    tr = trainer(tmp_path, cb, hub_token="hf_SECRET_TOKEN")
    tr.train()
    run_dir = tmp_path / "runs" / "hf" / "r1"

    # one line per step that holds data, at the Trainer's global_step, its own names
    lines = read_lines(run_dir / "metrics.jsonl")
    assert [r["_step"] for r in lines] == [2, 4, 5, 6, 8, 10]
    rows = rows_by_step(run_dir)
    for step in (2, 4, 6, 8, 10):
        assert {"loss", "grad_norm", "learning_rate", "epoch"} <= set(rows[step])
    assert set(rows[5]) >= {"eval_loss", "eval_runtime", "epoch"} and "loss" not in rows[5]
    # the evaluation at the last training step merged into that step's row, with the
    # end-of-training summary row the Trainer logs at the same step
    assert {"loss", "eval_loss", "train_loss", "train_runtime"} <= set(rows[10])
    history = {h["step"]: h for h in tr.state.log_history if "eval_loss" in h}
    assert rows[5]["eval_loss"] == history[5]["eval_loss"]
    assert rows[10]["eval_loss"] == history[10]["eval_loss"]

    # the TrainingArguments and the model config, nested; tokens left out
    text = (run_dir / "config.json").read_text()
    config = json.loads(text)
    assert set(config) == {"args", "model"}
    assert config["args"]["learning_rate"] == tr.args.learning_rate
    assert config["args"]["max_steps"] == 10 and config["args"]["logging_steps"] == 2
    assert "hub_token" not in config["args"] and "hf_SECRET_TOKEN" not in text
    assert config["model"]["hidden_size"] == 16 and config["model"]["num_hidden_layers"] == 2
    assert config["model"]["model_type"] == "bert"

    info = json.loads((run_dir / "run.json").read_text())
    assert info["status"] == "finished" and info["last_step"] == 10
    assert info["tags"] == ["tiny"]  # the spec applied
    assert et.run is None and cb.run.finished  # finished at on_train_end, not current
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["eval_loss"] == rows[10]["eval_loss"]


def test_eval_at_each_logging_step_lands_in_the_train_row(tmp_path):
    cb = ExprTrackerCallback(project="hf", name="same")
    trainer(tmp_path, cb, eval_steps=2).train()
    run = cb.run
    rows = rows_by_step(run.dir)
    assert sorted(rows) == [2, 4, 6, 8, 10]
    for step, row in rows.items():
        assert "loss" in row and "eval_loss" in row, (step, row)
    assert run.info()["history"]["dropped"].get("backward_step", 0) == 0


def test_evaluate_after_training_lands_at_the_last_step(tmp_path, capsys):
    cb = ExprTrackerCallback(project="hf", name="later")
    tr = trainer(tmp_path, cb, eval_strategy="no")
    tr.train()
    run_dir = tmp_path / "runs" / "hf" / "later"
    assert status_of(run_dir) == "finished"
    assert "eval_loss" not in rows_by_step(run_dir)[10]

    metrics = tr.evaluate()  # the run was finished: it is reopened, then finished again
    rows = rows_by_step(run_dir)
    assert rows[10]["eval_loss"] == metrics["eval_loss"]
    assert "loss" in rows[10]  # merged with the training row of that step
    assert status_of(run_dir) == "finished" and et.run is None

    tr.evaluate()  # and again
    assert status_of(run_dir) == "finished" and et.run is None
    info = json.loads((run_dir / "run.json").read_text())
    assert len(info["previous_attempts"]) == 2 and info["last_step"] == 10
    assert [r["_step"] for r in read_lines(run_dir / "metrics.jsonl")][-2:] == [10, 10]
    # the run's whole life, not the last evaluate's (issue 21, point 4)
    train, first_eval = info["previous_attempts"]
    assert info["first_started_at"] == train["started_at"]
    assert info["wall_duration_s"] == round(info["ended_at"] - train["started_at"], 3)
    total = train["duration_s"] + first_eval["duration_s"] + info["duration_s"]
    assert info["active_duration_s"] == round(total, 3) > info["duration_s"]


def test_evaluate_before_training_starts_and_finishes_a_run(tmp_path):
    cb = ExprTrackerCallback(project="hf", name="pre")
    tr = trainer(tmp_path, cb)
    metrics = tr.evaluate()
    run_dir = tmp_path / "runs" / "hf" / "pre"
    assert rows_by_step(run_dir)[0]["eval_loss"] == metrics["eval_loss"]
    assert status_of(run_dir) == "finished" and et.run is None
    assert json.loads((run_dir / "config.json").read_text())["model"]["model_type"] == "bert"


def test_joins_the_users_run_and_never_finishes_it(tmp_path):
    run = et.init(project="hf", name="mine", config={"user_key": 1})
    et.log({"before": 1.0})  # step 0
    cb = ExprTrackerCallback(project="ignored-when-joining")
    tr = trainer(tmp_path, cb)
    tr.train()
    assert cb.run is run and et.run is run and not run.finished
    metrics = tr.evaluate()  # lands in the user's run, still open
    assert et.run is run and not run.finished
    et.log({"after": 2.0}, step=tr.state.global_step)
    et.finish()

    rows = rows_by_step(run.dir)
    assert rows[0]["before"] == 1.0
    assert {"loss", "eval_loss", "after"} <= set(rows[10])
    assert rows[10]["eval_loss"] == metrics["eval_loss"]
    config = json.loads((run.dir / "config.json").read_text())
    assert config["user_key"] == 1 and config["args"]["max_steps"] == 10
    assert config["model"]["model_type"] == "bert"
    assert status_of(run.dir) == "finished"
    assert not (tmp_path / "runs" / "ignored-when-joining").exists()


class SpanTrainer(Trainer):
    """The user's own code inside the loop: a span and a metric in ``compute_loss``."""

    def compute_loss(self, model, inputs, *args, **kwargs):
        with et.span("compute"):
            loss = super().compute_loss(model, inputs, *args, **kwargs)
        if model.training:
            et.log({"seen_step": self.state.global_step + 1}, commit=False)
        return loss


def test_spans_and_user_metrics_land_on_the_trainers_steps(tmp_path):
    def collate(features):
        with et.span("data"):
            return {k: torch.stack([f[k] for f in features]) for k in features[0]}

    cb = ExprTrackerCallback(project="hf", name="spans")
    tr = trainer(tmp_path, cb, trainer_cls=SpanTrainer)
    tr.data_collator = collate
    tr.train()
    rows = rows_by_step(cb.run.dir)
    assert sorted(rows) == list(range(1, 11))  # every optimizer step has its own row
    for step, row in rows.items():
        assert row["seen_step"] == step, row  # the step being trained
        assert row["time_ms/compute"] > 0 and row["time_ms/data"] > 0, row
    assert "loss" in rows[2] and "loss" not in rows[3]
    spans = read_lines(cb.run.dir / "spans.jsonl")
    assert {s["_step"] for s in spans if s["name"] == "compute"} == set(range(1, 11))


class StepTimer:
    """A user's callback timing each optimizer step: a span from ``on_step_begin`` to
    ``on_step_end``, which the tracker's own logs of those hooks reach while it runs."""

    def __init__(self) -> None:
        self.span = None

    def __getattr__(self, name):  # every other TrainerCallback hook: nothing to do
        if name.startswith("on_"):
            return lambda *args, **kwargs: None
        raise AttributeError(name)

    def on_step_begin(self, args, state, control, **kwargs):
        self.span = et.start_span("optimizer_step", trained=state.global_step + 1)

    def on_step_end(self, args, state, control, **kwargs):
        self.span.end()


class LogInSpanTrainer(Trainer):
    """A span around ``compute_loss`` holding the user's ``et.log(d, commit=False)``."""

    def compute_loss(self, model, inputs, *args, **kwargs):
        with et.span("compute"):
            loss = super().compute_loss(model, inputs, *args, **kwargs)
            if model.training:
                et.log({"seen_step": self.state.global_step + 1}, commit=False)
        return loss


@pytest.mark.parametrize("timer_first", [True, False])
def test_spans_around_the_trainers_own_logs_land_on_the_step_trained(tmp_path, timer_first):
    """The callback logs at on_step_begin (opening global_step + 1) and on_step_end: a
    user's span over the whole optimizer step, and one holding a log(commit=False), are
    reached by a log() while they run, so they join the step open when they end, the step
    trained (base code: the step timer's time one row late, its last span in no row)."""
    cb = ExprTrackerCallback(project="hf", name=f"timer-{timer_first}")
    timer = StepTimer()
    tr = LogInSpanTrainer(
        model=tiny_bert(),
        args=training_args(tmp_path, eval_strategy="no"),
        train_dataset=RandomTokens(64, 0),
        callbacks=[timer, cb] if timer_first else [cb, timer],
    )
    tr.train()
    rows = rows_by_step(cb.run.dir)
    assert sorted(rows) == list(range(1, 11))
    for step, row in rows.items():
        assert row["seen_step"] == step, row
        # compute nests in the step timer's span (started with start_span, on this thread)
        assert row["time_ms/optimizer_step"] > row["time_ms/optimizer_step/compute"] > 0, row
    spans = read_lines(cb.run.dir / "spans.jsonl")
    timed = [s for s in spans if s["name"] == "optimizer_step"]
    assert [s["_step"] for s in timed] == [s["args"]["trained"] for s in timed]
    assert [s["_step"] for s in timed] == list(range(1, 11))
    computed = [s["_step"] for s in spans if s["name"] == "optimizer_step/compute"]
    assert computed == list(range(1, 11))


class PlainLogTrainer(Trainer):
    def compute_loss(self, model, inputs, *args, **kwargs):
        if model.training:
            et.log({"mine": 1.0})  # commits the step being trained: the Trainer's row is late
        return super().compute_loss(model, inputs, *args, **kwargs)


def test_a_plain_log_inside_the_loop_is_explained(tmp_path, caplog):
    cb = ExprTrackerCallback(project="hf", name="plain")
    with caplog.at_level(logging.WARNING, logger="expr_tracker"):
        trainer(tmp_path, cb, trainer_cls=PlainLogTrainer, eval_strategy="no").train()
    hints = [r.getMessage() for r in caplog.records if "log with commit=False" in r.getMessage()]
    assert len(hints) == 1 and "row at step 2 was dropped" in hints[0]


def test_the_same_name_again_explains_the_dropped_rows(tmp_path, caplog):
    # a script run twice: et.init continues the run of that name, which is ahead of the
    # Trainer's global_step 0; the warning names that cause, not a plain et.log() in the loop
    trainer(tmp_path, ExprTrackerCallback(project="hf", name="again"), eval_strategy="no").train()
    first = rows_by_step(tmp_path / "runs" / "hf" / "again")
    cb = ExprTrackerCallback(project="hf", name="again")
    with caplog.at_level(logging.WARNING, logger="expr_tracker"):
        trainer(tmp_path, cb, eval_strategy="no").train()  # the same arguments: continued
    messages = [r.getMessage() for r in caplog.records]
    ahead = [m for m in messages if "already holds steps up to 10" in m]
    assert len(ahead) == 1 and "resume_from_checkpoint" in ahead[0], messages
    assert "steps 1-10 are dropped" in ahead[0]
    assert not [m for m in messages if "commit=False" in m], messages
    assert rows_by_step(cb.run.dir) == first  # the earlier attempt's rows are kept
    assert status_of(cb.run.dir) == "finished"


def test_the_same_name_with_other_arguments_is_a_new_run(tmp_path, capsys):
    """The Trainer's arguments are the config given at init: another learning rate under
    the same name starts <name>-2, and the first run's config.json keeps its own."""
    cb = ExprTrackerCallback(project="hf", name="lr")
    trainer(tmp_path, cb, eval_strategy="no", learning_rate=1e-4).train()
    cb2 = ExprTrackerCallback(project="hf", name="lr")
    trainer(tmp_path, cb2, eval_strategy="no", learning_rate=3e-4).train()
    assert cb.run.name == "lr" and cb2.run.name == "lr-2"
    assert "args.learning_rate: 0.0001 -> 0.0003" in capsys.readouterr().err
    runs = tmp_path / "runs" / "hf"
    assert json.loads((runs / "lr" / "config.json").read_text())["args"]["learning_rate"] == 1e-4
    assert json.loads((runs / "lr-2" / "config.json").read_text())["args"]["learning_rate"] == 3e-4
    assert sorted(rows_by_step(runs / "lr-2")) == [2, 4, 6, 8, 10]


class FailingTrainer(Trainer):
    def compute_loss(self, model, inputs, *args, **kwargs):
        if model.training and self.state.global_step == 4:
            raise RuntimeError("boom at step 5")
        return super().compute_loss(model, inputs, *args, **kwargs)


def test_a_failed_train_then_a_new_train_marks_the_first_failed(tmp_path):
    cb = ExprTrackerCallback(project="hf")
    with pytest.raises(RuntimeError, match="boom"):
        trainer(tmp_path, cb, trainer_cls=FailingTrainer).train()
    first = cb.run
    assert et.run is None and first.finished  # finished as the exception left train()
    trainer(tmp_path, cb).train()  # the program caught it and trains again
    second = cb.run
    assert second is not first and first.finished
    assert status_of(first.dir) == "failed" and status_of(second.dir) == "finished"
    assert sorted(rows_by_step(first.dir))[:2] == [2, 4]


def test_evaluate_after_a_caught_failure_lands_and_the_training_is_failed(tmp_path, caplog):
    # a notebook: train() raises in step 5 (row 5 opened), the user evaluates what was trained
    cb = ExprTrackerCallback(project="hf", name="nb")
    tr = trainer(tmp_path, cb, trainer_cls=FailingTrainer, eval_strategy="no")
    with pytest.raises(RuntimeError, match="boom"):
        tr.train()
    with caplog.at_level(logging.WARNING, logger="expr_tracker"):
        metrics = tr.evaluate()
    assert not [r for r in caplog.records if "dropped" in r.getMessage()]
    rows = rows_by_step(cb.run.dir)
    assert rows[4]["eval_loss"] == metrics["eval_loss"] and rows[4]["loss"] > 0
    info = json.loads((cb.run.dir / "run.json").read_text())
    assert [a["status"] for a in info["previous_attempts"]] == ["failed"]
    assert et.run is None and cb.run.finished


def test_evaluate_and_a_rerun_compare_the_config_training_started_with(tmp_path, capsys):
    """The model's first forward sets ``model.config.problem_type``: that is training, not
    another experiment. ``evaluate()`` after ``train()`` records no config change, and the
    same script again (a fresh model, the same arguments) continues the run, not ``-2``."""
    cb = ExprTrackerCallback(project="hf", name="te")
    tr = trainer(tmp_path, cb, eval_strategy="no")
    assert tr.model.config.problem_type is None
    tr.train()
    assert tr.model.config.problem_type == "single_label_classification"
    tr.evaluate()
    err = capsys.readouterr().err
    assert "config changed" not in err, err
    info = json.loads((cb.run.dir / "run.json").read_text())
    assert "config_changes" not in info
    assert not [a for a in info["previous_attempts"] if "config_changes" in a]
    cb2 = ExprTrackerCallback(project="hf", name="te")
    trainer(tmp_path, cb2, eval_strategy="no").train()
    assert cb2.run.name == "te", capsys.readouterr().err
    assert not (tmp_path / "runs" / "hf" / "te-2").exists()


class OnceFailingTrainer(Trainer):
    failed = False

    def compute_loss(self, model, inputs, *args, **kwargs):
        if model.training and self.state.global_step == 4 and not self.failed:
            self.failed = True
            raise RuntimeError("boom at step 5")
        return super().compute_loss(model, inputs, *args, **kwargs)


def test_training_again_after_a_caught_failure_is_the_same_run(tmp_path, capsys):
    """A notebook trains, fails, trains again: the next attempt of the same run (the
    model's config changed by its first forward decides nothing)."""
    cb = ExprTrackerCallback(project="hf", name="retry")
    tr = trainer(tmp_path, cb, trainer_cls=OnceFailingTrainer, eval_strategy="no")
    with pytest.raises(RuntimeError, match="boom"):
        tr.train()
    tr.train()
    err = capsys.readouterr().err
    assert cb.run.name == "retry", err
    assert "another config" not in err and "config changed" not in err, err
    info = json.loads((cb.run.dir / "run.json").read_text())
    assert info["status"] == "finished"
    assert [a["status"] for a in info["previous_attempts"]] == ["failed"]


FAILING_SCRIPT = """
import os, sys
sys.path.insert(0, {tests!r})
sys.path.insert(0, {here!r})
from pathlib import Path
from test_transformers import ExprTrackerCallback, FailingTrainer, trainer
tr = trainer(Path.cwd(), ExprTrackerCallback(project="hf", name="dies"), trainer_cls=FailingTrainer)
tr.train()
"""


def test_an_exception_in_the_loop_marks_the_run_failed(tmp_path):
    code = FAILING_SCRIPT.format(tests=str(ROOT / "tests"), here=os.path.dirname(__file__))
    env = dict(OFFLINE, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = run_py(
        f"import os; os.chdir({str(tmp_path)!r})\n" + textwrap.dedent(code),
        check=False,
        timeout=180,
        env=env,
    )
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "boom at step 5" in proc.stderr
    run_dir = tmp_path / "runs" / "hf" / "dies"
    info = json.loads((run_dir / "run.json").read_text())
    assert info["status"] == "failed"
    assert "RuntimeError" in json.dumps(info)
    rows = rows_by_step(run_dir)
    assert rows[2]["loss"] > 0 and rows[4]["loss"] > 0  # what was logged before survived


CAUGHT_SCRIPT = """
import os, sys
sys.path.insert(0, {tests!r})
sys.path.insert(0, {here!r})
from pathlib import Path
from test_transformers import ExprTrackerCallback, FailingTrainer, trainer
tr = trainer(Path.cwd(), ExprTrackerCallback(project="hf", name="caught"), trainer_cls=FailingTrainer)
try:
    tr.train()
except RuntimeError as exc:
    print("caught", exc)
"""


def test_an_exception_the_program_catches_still_marks_the_run_failed(tmp_path):
    """The exception never reaches the exit hook: the callback finishes its run as failed
    as the exception leaves train() (issue 21, point 5)."""
    code = CAUGHT_SCRIPT.format(tests=str(ROOT / "tests"), here=os.path.dirname(__file__))
    env = dict(OFFLINE, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = run_py(
        f"import os; os.chdir({str(tmp_path)!r})\n" + textwrap.dedent(code),
        check=False,
        timeout=180,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "caught boom at step 5" in proc.stdout
    info = json.loads((tmp_path / "runs" / "hf" / "caught" / "run.json").read_text())
    assert info["status"] == "failed"
    assert info["exception"]["type"] == "RuntimeError"
    assert info["exception"]["message"] == "boom at step 5"


def _nesting_trainer(tmp_path, inner_callback):
    """A Trainer that trains a second Trainer (4 steps, ``inner_callback``) inside its own
    step 3, as a distillation or an inner evaluation loop might."""
    done = []

    class Outer(Trainer):
        def compute_loss(self, model, inputs, *args, **kwargs):
            if model.training and self.state.global_step == 2 and not done:
                done.append(
                    trainer(tmp_path / "inner", inner_callback, max_steps=4, eval_strategy="no")
                )
                done[0].train()
            return super().compute_loss(model, inputs, *args, **kwargs)

    return Outer


def test_a_nested_trainer_with_its_own_name_gets_its_own_run(tmp_path):
    inner = ExprTrackerCallback(project="hf", name="B")
    outer = ExprTrackerCallback(project="hf", name="A")
    trainer(tmp_path, outer, trainer_cls=_nesting_trainer(tmp_path, inner)).train()
    a_dir, b_dir = tmp_path / "runs" / "hf" / "A", tmp_path / "runs" / "hf" / "B"
    assert outer.run.dir.resolve() == a_dir.resolve() and inner.run.dir.resolve() == b_dir.resolve()
    assert sorted(rows_by_step(a_dir)) == [2, 4, 5, 6, 8, 10]
    b_rows = rows_by_step(b_dir)
    assert sorted(b_rows) == [2, 4] and all("loss" in r for r in b_rows.values())
    assert json.loads((a_dir / "config.json").read_text())["args"]["max_steps"] == 10
    assert json.loads((b_dir / "config.json").read_text())["args"]["max_steps"] == 4
    assert status_of(a_dir) == "finished" and status_of(b_dir) == "finished"
    assert et.run is None


def test_a_nested_trainer_joining_the_run_never_replaces_its_config(tmp_path, caplog):
    inner = ExprTrackerCallback(project="hf")  # no run of its own: joins A
    outer = ExprTrackerCallback(project="hf", name="A")
    with caplog.at_level(logging.WARNING, logger="expr_tracker"):
        trainer(tmp_path, outer, trainer_cls=_nesting_trainer(tmp_path, inner)).train()
    a_dir = tmp_path / "runs" / "hf" / "A"
    assert inner.run is outer.run
    config = json.loads((a_dir / "config.json").read_text())
    assert config["args"]["max_steps"] == 10  # A's, not the inner Trainer's 4
    kept = [r.getMessage() for r in caplog.records if "never replaced" in r.getMessage()]
    assert len(kept) == 1 and "args" in kept[0]
    assert status_of(a_dir) == "finished"


# ---------------------------------------------------------------------- arguments, ranks


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"spec": 42}, TypeError, r"spec=.*path, a dict or an OmegaConf DictConfig, got int"),
        ({"project": 3}, TypeError, r"project=.*string or None, got int"),
        ({"rank_zero_only": "yes"}, TypeError, r"rank_zero_only=.*True or False"),
        ({"log_config": None}, TypeError, r"log_config="),
        ({"step_policy": "sideways"}, SpecError, r"history.step_policy: 'sideways'.*'monotonic'"),
        ({"projct": "x"}, SpecError, r"projct: unknown keyword.*did you mean `project`"),
        ({"spec": "missing.yaml"}, SpecError, r"file not found: missing.yaml"),
        ({"spec": {"history": {"buffer": {"size": -1}}}}, SpecError, r"history.buffer.size"),
        ({"mode": "sideways"}, SpecError, r"mode"),  # a wandb keyword: et.init checks it
    ],
)
def test_bad_arguments_raise_clearly(tmp_path, kwargs, error, match):
    if kwargs.get("mode"):  # et.init maps wandb's keywords: raised when training starts
        cb = ExprTrackerCallback(project="hf", **kwargs)
        with pytest.raises(error, match=match):
            cb.on_train_begin(training_args(tmp_path), state(), None, model=None)
    else:
        with pytest.raises(error, match=match):
            ExprTrackerCallback(**kwargs)
    assert not (tmp_path / "runs").exists()


def test_spec_as_path_and_dictconfig(tmp_path):
    omegaconf = pytest.importorskip("omegaconf")
    (tmp_path / "tracker.yaml").write_text("project: fromfile\ntags: [a]\n")
    cb = ExprTrackerCallback(spec=str(tmp_path / "tracker.yaml"), name="p")
    cb.on_train_begin(training_args(tmp_path), state(), None, model=tiny_bert())
    assert cb.run.project == "fromfile" and cb.run.tags == ["a"]
    cb.on_train_end(None, state(), None)
    cfg = omegaconf.OmegaConf.create({"tracker": {"project": "dc", "tags": ["${x}"]}, "x": "b"})
    cb = ExprTrackerCallback(spec=cfg.tracker, name="d")
    cb.on_train_begin(training_args(tmp_path), state(), None, model=None)
    assert cb.run.project == "dc" and cb.run.tags == ["b"]
    cb.on_train_end(None, state(), None)
    assert status_of(cb.run.dir) == "finished"


def state(global_step: int = 0, zero: bool = True) -> SimpleNamespace:
    return SimpleNamespace(global_step=global_step, is_world_process_zero=zero)


def test_other_ranks_track_nothing_unless_configured(tmp_path):
    args = training_args(tmp_path)
    cb = ExprTrackerCallback(project="hf", name="ranks")
    cb.on_train_begin(args, state(zero=False), None, model=None)
    cb.on_step_begin(args, state(zero=False), None)
    cb.on_log(args, state(1, zero=False), None, logs={"loss": 1.0})
    cb.on_train_end(args, state(1, zero=False), None)
    assert cb.run is None and et.run is None and not (tmp_path / "runs").exists()

    cb = ExprTrackerCallback(project="hf", name="ranks", rank_zero_only=False)
    cb.on_train_begin(args, state(zero=False), None, model=None)
    cb.on_step_begin(args, state(zero=False), None)
    cb.on_log(args, state(1, zero=False), None, logs={"loss": 1.0})
    cb.on_train_end(args, state(1, zero=False), None)
    assert rows_by_step(tmp_path / "runs" / "hf" / "ranks")[1]["loss"] == 1.0


def test_a_failing_hook_warns_once_and_training_goes_on(tmp_path, caplog):
    class BadArgs:
        def to_dict(self):
            raise ValueError("cannot serialise")

    cb = ExprTrackerCallback(project="hf", name="warns")
    with caplog.at_level(logging.WARNING, logger="expr_tracker"):
        cb.on_train_begin(BadArgs(), state(), None, model=None)
        cb.run.log = None  # breaks every later log: each hook warns once, nothing raises
        for step in (1, 2):
            cb.on_step_begin(None, state(step - 1), None)
            cb.on_step_end(None, state(step), None)
            cb.on_log(None, state(step), None, logs={"loss": 1.0})
        cb.on_train_end(None, state(2), None)
    messages = [r.getMessage() for r in caplog.records]
    assert sum("recording the config failed" in m for m in messages) == 1
    assert sum("ExprTrackerCallback logging failed" in m for m in messages) == 1
    assert sum("opening the step failed" in m for m in messages) == 1
    assert cb.run.finished and status_of(cb.run.dir) == "finished"


def test_the_keywords_left_to_et_init_cover_wandbs():
    from expr_tracker.integrations import transformers as integration
    from expr_tracker.wandb_compat import _WANDB_ONLY

    assert _WANDB_ONLY <= integration._MAPPED_BY_INIT


def test_a_stop_rule_stops_the_trainer(tmp_path):
    """``=> stop`` (docs/alerts.md "Actions"): the callback sets
    ``control.should_training_stop``, the Trainer ends at that optimizer step."""
    callback = ExprTrackerCallback(
        project="hf", name="stop", dir=tmp_path / "runs", alert_rules=["step() >= 3 => stop"]
    )
    tr = trainer(tmp_path, callback)
    tr.train()
    run_dir = tmp_path / "runs" / "hf" / "stop"
    info = json.loads((run_dir / "run.json").read_text())
    fired = info["stop_request"]["step"]
    assert fired in (3, 4)  # the commit of row 3 or 4, whichever first sees step() >= 3
    # the Trainer stops at the end of the optimizer step during which the rule fired
    assert tr.state.global_step in (fired, fired + 1) and tr.state.global_step < 10
    assert status_of(run_dir) == "finished"
