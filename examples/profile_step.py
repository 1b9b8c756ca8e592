"""Where does a training step's time go? Spans, plugins and a Perfetto timeline.

    python examples/profile_step.py [--steps 30] [--dir runs] [--device cpu|cuda]

Times data loading (in a background thread, its own track in the trace), forward, backward
and the optimizer step of a small torch model; measures CPU time on every span
(``CpuTime``, run-wide through the spec) and, on a GPU, the allocator's peak
(``TorchMemory``) and device utilisation (``GpuStats``). Prints the first step's span tree,
a table of mean milliseconds per span, and writes ``trace.json`` for ui.perfetto.dev.
"""

from __future__ import annotations

import argparse
import queue
import threading

import torch
from rich.console import Console
from rich.table import Table
from torch import nn

import expr_tracker as et
from expr_tracker.plugins import GpuStats, TorchMemory
from expr_tracker.trace import write_trace


def loader(q: queue.Queue, steps: int, device: str) -> None:
    """A producer thread: its spans land on their own track of the timeline."""
    for i in range(steps):
        with et.span("load", batch=i):
            x = torch.randn(256, 512)
            y = torch.randint(0, 10, (256,))
        q.put((x.to(device), y.to(device)))
    q.put(None)


def main(argv: list[str] | None = None) -> et.Run:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--dir", default="runs")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)

    run = et.init(
        project="profile_step",
        dir=args.dir,
        spec={"spans": {"plugins": [{"type": "cpu_time"}], "count": True}},
    )
    gpu_plugins = [TorchMemory(), GpuStats()] if args.device == "cuda" else []
    model = nn.Sequential(nn.Linear(512, 1024), nn.GELU(), nn.Linear(1024, 10)).to(args.device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    q: queue.Queue = queue.Queue(maxsize=4)
    threading.Thread(target=loader, args=(q, args.steps, args.device), daemon=True).start()

    step = 0
    while True:
        with et.span("wait_data"):
            batch = q.get()
        if batch is None:
            break
        x, y = batch
        printer = print if step == 0 else None  # the span tree of the first step
        with et.span("step", print_fn=printer, plugins=gpu_plugins or None):
            with et.span("forward"):
                loss = nn.functional.cross_entropy(model(x), y)
            with et.span("backward"):
                opt.zero_grad(set_to_none=True)
                loss.backward()
            with et.span("optimizer"):
                opt.step()
            if args.device == "cuda":
                torch.cuda.synchronize()  # make the span mean GPU time too
        et.log({"loss": loss.item()})
        step += 1
    et.finish()

    rows = et.read_history(run.dir)
    table = Table(title=f"mean ms per step over {len(rows)} steps")
    table.add_column("span")
    table.add_column("time_ms", justify="right")
    table.add_column("cpu_percent", justify="right")
    for key in sorted({k for r in rows for k in r if k.startswith("time_ms/")}):
        path = key.split("/", 1)[1]
        times = [r[key] for r in rows if key in r]
        cpu = [r[f"cpu_percent/{path}"] for r in rows if f"cpu_percent/{path}" in r]
        table.add_row(
            path,
            f"{sum(times) / len(times):.3f}",
            f"{sum(cpu) / len(cpu):.0f}" if cpu else "-",
        )
    Console().print(table)
    out = run.dir / "trace.json"
    write_trace(run.dir, out)
    print(f"timeline: {out}  (open it in https://ui.perfetto.dev)")
    return run


if __name__ == "__main__":
    main()
