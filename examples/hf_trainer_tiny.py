"""A Hugging Face Trainer tracked by expr_tracker: a tiny BERT on random tokens, offline, seconds.

    pip install 'expr-tracker[transformers]'
    python examples/hf_trainer_tiny.py [--dir runs] [--name NAME] [--steps 20]

What it shows: ``ExprTrackerCallback`` passed to ``Trainer(callbacks=[...])`` with
``report_to="none"``; a run spec given as a dict (an alert rule on the Trainer's own
``loss``); a span in the data collator, whose time lands on the Trainer's steps
(``time_ms/collate``); evaluation rows merged into the training row of their step; and a
``trainer.evaluate()`` after training landing in the same run. No download: the model is built
from a ``BertConfig`` and the data are random tensors. The run lands in
``<dir>/hf-tiny/<name>/`` (``metrics.jsonl``, ``config.json`` with ``args`` and ``model``,
``run.json``, ...).
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach the Hub
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
from transformers import (  # noqa: E402
    BertConfig,
    BertForSequenceClassification,
    Trainer,
    TrainingArguments,
)

import expr_tracker as et  # noqa: E402
from expr_tracker.integrations.transformers import ExprTrackerCallback  # noqa: E402

SEQ_LEN = 8
VOCAB = 100


class RandomTokens(torch.utils.data.Dataset):
    """``n`` random token sequences; the label is whether token 0 is in the upper half of the
    vocabulary (so there is something to learn)."""

    def __init__(self, n: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, VOCAB, (n, SEQ_LEN), generator=g)
        self.labels = (self.ids[:, 0] >= VOCAB // 2).long()

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.labels[i]}


def collate(features: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    with et.span("collate"):  # user code inside the Trainer: its time joins the step's row
        batch = {k: torch.stack([f[k] for f in features]) for k in features[0]}
        batch["attention_mask"] = torch.ones_like(batch["input_ids"])
        return batch


def main(argv: list[str] | None = None) -> str:
    """Train and evaluate; returns the run directory."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default="runs", help="parent directory of runs (default: runs)")
    parser.add_argument("--name", default=None, help="run name (default: a timestamp)")
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps (default: 20)")
    parser.add_argument("--out", default=None, help="Trainer output_dir (default: <dir>/hf-out)")
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    model = BertForSequenceClassification(
        BertConfig(
            vocab_size=VOCAB,
            hidden_size=16,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=32,
        )
    )
    training_args = TrainingArguments(
        output_dir=args.out or os.path.join(args.dir, "hf-out"),
        report_to="none",  # expr_tracker is the callback below
        max_steps=args.steps,
        logging_steps=2,
        eval_strategy="steps",
        eval_steps=5,
        save_strategy="no",
        per_device_train_batch_size=8,
        per_device_eval_batch_size=16,
        learning_rate=1e-3,
        use_cpu=True,
        disable_tqdm=True,
        seed=0,
    )
    callback = ExprTrackerCallback(
        project="hf-tiny",
        name=args.name,
        dir=args.dir,
        spec={"alerts": {"rules": ["isnan(loss) => critical: loss is NaN at step {step}"]}},
        tags=["example"],
    )
    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=RandomTokens(256, seed=0),
        eval_dataset=RandomTokens(64, seed=1),
        data_collator=collate,
        callbacks=[callback],
    )
    trainer.train()  # starts the run, finishes it at the end of training
    metrics = trainer.evaluate()  # reopens the same run: lands at the last step
    run = callback.run
    print(f"run: {run.dir}  final eval_loss: {metrics['eval_loss']:.4f}")
    for row in et.read_history(run.dir)[-3:]:
        print({k: row[k] for k in sorted(row) if k in ("_step", "loss", "eval_loss")})
    return str(run.dir)


if __name__ == "__main__":
    main()
