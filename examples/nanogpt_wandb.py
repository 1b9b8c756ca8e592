"""A nanoGPT-style training script written for wandb, tracked by expr_tracker.

The only change from a wandb script is the import line: ``import expr_tracker as wandb``.
It trains a tiny character-level GPT on generated text (CPU, no download) with the calls a
wandb training loop makes: ``wandb.init(project=, name=, config=)``, ``wandb.config.x``,
``wandb.define_metric``, ``wandb.log``, ``wandb.run.summary[...]``, ``wandb.summary``,
``wandb.run.name``/``id``, ``wandb.finish()``.

    python examples/nanogpt_wandb.py                  # writes ./runs/nanogpt/tiny-shakespeare/
    python examples/nanogpt_wandb.py max_iters=200    # override a config value
"""

from __future__ import annotations

import math
import sys
import time
from ast import literal_eval

import torch
import torch.nn as nn
from torch.nn import functional as F

import expr_tracker as wandb  # the only line that differs from a wandb script

# -- config, nanoGPT style: module-level values, overridable as key=value arguments --------
wandb_log = True
wandb_project = "nanogpt"
wandb_run_name = "tiny-shakespeare"
out_dir = "runs"
batch_size = 8
block_size = 16
n_layer = 2
n_head = 2
n_embd = 32
dropout = 0.0
learning_rate = 3e-3
min_lr = 3e-4
warmup_iters = 10
max_iters = 60
eval_interval = 20
eval_iters = 5
seed = 1337
# the keys are taken before the overrides run (as nanoGPT's configurator.py is), so the loop's
# own variables never reach the config: the same values in another order, or a default
# given explicitly, are the same config (and so the same run: docs/streams.md, "Run identity")
config_keys = [
    k
    for k, v in globals().items()
    if not k.startswith("_") and isinstance(v, (int, float, bool, str))
]
for arg in sys.argv[1:]:
    key, _, value = arg.partition("=")
    try:
        parsed = literal_eval(value)  # as nanoGPT: wandb_log=False is False, not bool("False")
    except (SyntaxError, ValueError):
        parsed = value
    default = globals()[key]
    globals()[key] = float(parsed) if isinstance(default, float) and type(parsed) is int else parsed
    assert type(globals()[key]) is type(default), f"{key}: expected {type(default).__name__}"
config = {k: globals()[k] for k in config_keys}


# -- data: generated text, split 90/10 ------------------------------------------------------
def make_text(n_chars: int) -> str:
    words = ["to", "be", "or", "not", "that", "is", "the", "question", "whether", "tis"]
    g = torch.Generator().manual_seed(seed)
    out = []
    while sum(len(w) + 1 for w in out) < n_chars:
        out.append(words[int(torch.randint(len(words), (1,), generator=g))])
    return " ".join(out)


text = make_text(20_000)
chars = sorted(set(text))
stoi = {c: i for i, c in enumerate(chars)}
data = torch.tensor([stoi[c] for c in text], dtype=torch.long)
split = int(0.9 * len(data))
train_data, val_data = data[:split], data[split:]


def get_batch(which: str) -> tuple[torch.Tensor, torch.Tensor]:
    d = train_data if which == "train" else val_data
    ix = torch.randint(len(d) - block_size, (batch_size,))
    x = torch.stack([d[i : i + block_size] for i in ix])
    y = torch.stack([d[i + 1 : i + 1 + block_size] for i in ix])
    return x, y


# -- model: a tiny GPT ----------------------------------------------------------------------
class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(n_embd)
        self.attn = nn.MultiheadAttention(n_embd, n_head, dropout=dropout, batch_first=True)
        self.ln2 = nn.LayerNorm(n_embd)
        self.mlp = nn.Sequential(
            nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.size(1)
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab_size: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab_size, n_embd)
        self.pos = nn.Embedding(block_size, n_embd)
        self.blocks = nn.Sequential(*[Block() for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(n_embd)
        self.head = nn.Linear(n_embd, vocab_size)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.size(1)))
        logits = self.head(self.ln_f(self.blocks(x)))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


@torch.no_grad()
def estimate_loss(model: GPT) -> dict[str, float]:
    model.eval()
    out = {}
    for which in ("train", "val"):
        losses = torch.zeros(eval_iters)
        for k in range(eval_iters):
            losses[k] = model(*get_batch(which)).item()
        out[which] = losses.mean().item()
    model.train()
    return out


def get_lr(it: int) -> float:
    if it < warmup_iters:
        return learning_rate * (it + 1) / warmup_iters
    ratio = (it - warmup_iters) / max(1, max_iters - warmup_iters)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (learning_rate - min_lr)


def main() -> None:
    torch.manual_seed(seed)
    if wandb_log:
        wandb.init(project=wandb_project, name=wandb_run_name, config=config, dir=out_dir)
        wandb.define_metric("val/loss", summary="min")
    model = GPT(len(chars))
    lr = wandb.config.learning_rate if wandb_log else learning_rate
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    n_params = sum(p.numel() for p in model.parameters())
    best_val_loss = 1e9
    t0 = time.perf_counter()
    for it in range(max_iters + 1):
        lr = get_lr(it)
        for group in optimizer.param_groups:
            group["lr"] = lr
        if it % eval_interval == 0:
            losses = estimate_loss(model)
            dt = max(time.perf_counter() - t0, 1e-9)
            mfu = 6 * n_params * batch_size * block_size * eval_interval / dt / 1e12
            print(f"step {it}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
            if wandb_log:
                wandb.log(
                    {
                        "iter": it,
                        "train/loss": losses["train"],
                        "val/loss": losses["val"],
                        "lr": lr,
                        "mfu": mfu * 100,
                    }
                )
            if losses["val"] < best_val_loss:
                best_val_loss = losses["val"]
                if wandb_log:
                    wandb.run.summary["best_val_loss"] = best_val_loss
            t0 = time.perf_counter()
        if it == max_iters:
            break
        loss = model(*get_batch("train"))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    if wandb_log:
        wandb.summary["n_params"] = n_params
        print(f"run {wandb.run.name} (id {wandb.run.id}) best val loss {best_val_loss:.4f}")
        wandb.finish()


if __name__ == "__main__":
    main()
