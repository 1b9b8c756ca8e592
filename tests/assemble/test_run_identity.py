"""Run identity (issue 10): default names never merge two runs, torchrun ranks share one, a
resume is announced, rank 0 alone writes the run-level files, a refused or racing start
touches nothing of the holder's, and names are bounded so every file fits."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import expr_tracker as et
from expr_tracker.history.reader import read_rows
from expr_tracker.spec import SpecError

NAME_RE = r"\d{8}-\d{6}-[0-9a-f]{6}"


def _spawn(code: str, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    full = dict(os.environ)
    full.update(env or {})
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=full,
    )


def _finish(p: subprocess.Popen, timeout: float = 120) -> tuple[int, str, str]:
    out, err = p.communicate(timeout=timeout)
    return p.returncode, out, err


def _next_second_plus(extra: float = 1.0) -> str:
    """A shared start moment just after a whole second, so children start in one second."""
    return repr(float(int(time.time() + extra)) + 0.05)


# ---------------------------------------------------------------- default names


SAME_SECOND_CHILD = """
import sys, time, expr_tracker as et
at = float(sys.argv[2])
time.sleep(max(0.0, at - time.time()))
run = et.init(project="p", dir=sys.argv[1])
et.log({"who": sys.argv[3]})
time.sleep(0.5)  # both runs are live at once
et.finish()
print(run.name, flush=True)
"""


@pytest.mark.slow
def test_default_names_differ_for_two_processes_started_in_one_second(tmp_path):
    at = _next_second_plus(1.5)
    procs = [_spawn(SAME_SECOND_CHILD, str(tmp_path / "runs"), at, who) for who in "ab"]
    results = [_finish(p) for p in procs]
    for rc, _, err in results:
        assert rc == 0, err
    names = [out.strip() for _, out, _ in results]
    assert names[0] != names[1]
    assert all(re.fullmatch(NAME_RE, n) for n in names), names
    dirs = sorted(d.name for d in (tmp_path / "runs" / "p").iterdir())
    assert dirs == sorted(names)
    for who, name in zip("ab", names, strict=True):
        rows = read_rows(tmp_path / "runs" / "p" / name / "metrics.jsonl")
        assert [r["who"] for r in rows] == [who]


def test_default_names_in_one_process_are_unique_and_sort_by_time():
    from expr_tracker.spec.names import default_run_name

    names = [default_run_name({}) for _ in range(200)]
    assert len(set(names)) == 200
    assert all(re.fullmatch(NAME_RE, n) for n in names)
    assert [n[:15] for n in names] == sorted(n[:15] for n in names)


def test_one_process_never_draws_a_default_name_twice_in_a_second(monkeypatch):
    """Six random hex digits drawn twice alike in one second (200 names at once did so about
    once in a thousand tries): the second draw is redrawn, not given out again."""
    import types

    from expr_tracker.spec import names

    draws = iter([b"\x00\x00\x01", b"\x00\x00\x01", b"\x00\x00\x02"])
    monkeypatch.setattr(names.os, "urandom", lambda n: next(draws))
    monkeypatch.setattr(names, "time", types.SimpleNamespace(strftime=lambda f: "20261203-101010"))
    first = names.default_run_name({})
    second = names.default_run_name({})
    assert (first, second) == ("20261203-101010-000001", "20261203-101010-000002")


def test_torchrun_default_name_rule():
    from expr_tracker.spec.names import default_run_name

    a = {"TORCHELASTIC_RUN_ID": "3f2a-uuid-a", "GROUP_WORLD_SIZE": "1"}
    b = {"TORCHELASTIC_RUN_ID": "3f2a-uuid-b", "GROUP_WORLD_SIZE": "1"}
    assert default_run_name(a) == default_run_name(dict(a))  # every rank of the launch
    assert default_run_name(a) != default_run_name(b)  # another launch
    if Path("/proc/self/stat").exists():
        assert re.fullmatch(NAME_RE, default_run_name(a))
    # the static default id "none" is shared by every launch: the agent tells them apart
    none = default_run_name({"TORCHELASTIC_RUN_ID": "none"})
    assert none == default_run_name({"TORCHELASTIC_RUN_ID": "none"})
    # several nodes share only the rendezvous id
    multi = {"TORCHELASTIC_RUN_ID": "job/42", "GROUP_WORLD_SIZE": "4"}
    assert default_run_name(multi) == "torchrun-job_42"


AGENT = """
import os, subprocess, sys, time
env = dict(os.environ, TORCHELASTIC_RUN_ID="launch-1", GROUP_WORLD_SIZE="1")
child = [sys.executable, "-c", "from expr_tracker.spec.names import default_run_name as d; print(d())"]
direct = subprocess.run(child, env=env, capture_output=True, text=True, check=True).stdout
time.sleep(1.1)  # the wrapper starts in a later second than this "agent"
wrapped = subprocess.run(
    ["bash", "-c", 'exec_child() { "$@"; }; exec_child "$@"', "bash", *child],
    env=env, capture_output=True, text=True, check=True,
).stdout
print(direct.strip(), wrapped.strip())
"""


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs /proc")
def test_torchrun_name_comes_from_the_agent_also_through_a_wrapper(tmp_path):
    """A rank started through a wrapper script (torchrun --no-python bash run.sh) finds the
    same agent, hence the same name, as a rank started directly."""
    rc, out, err = _finish(_spawn(AGENT))
    assert rc == 0, err
    direct, wrapped = out.split()
    assert direct == wrapped and re.fullmatch(NAME_RE, direct)


# ---------------------------------------------------------------- Hydra without the callback

HYDRA_APP = """
import hydra
import expr_tracker as et

@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg):
    run = et.init(spec=cfg.tracker, config=cfg)
    et.log({"lr": cfg.lr})
    et.finish()
    print("RUN", run.name, cfg.lr, flush=True)

if __name__ == "__main__":
    main()
"""

HYDRA_CONFIG = """
defaults:
  - tracker: default
  - _self_
lr: 0.1
tracker:
  project: sweep
"""


@pytest.mark.slow
def test_hydra_multirun_without_the_callback_gives_each_job_its_own_run(tmp_path):
    pytest.importorskip("hydra")
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "config.yaml").write_text(HYDRA_CONFIG)
    (tmp_path / "app.py").write_text(textwrap.dedent(HYDRA_APP))
    proc = subprocess.run(
        [sys.executable, "app.py", "-m", "lr=0.1,0.2,0.3"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr
    runs = sorted((tmp_path / "runs" / "sweep").iterdir())
    assert len(runs) == 3, [r.name for r in runs]
    assert "resuming" not in proc.stderr
    lrs = set()
    for r in runs:
        rows = read_rows(r / "metrics.jsonl")
        assert len(rows) == 1 and [x["_step"] for x in rows] == [0]
        lrs.add(rows[0]["lr"])
        assert json.loads((r / "config.json").read_text())["lr"] == rows[0]["lr"]
        info = json.loads((r / "run.json").read_text())
        assert info["status"] == "finished" and "previous_attempts" not in info
    assert lrs == {0.1, 0.2, 0.3}


# ---------------------------------------------------------------- torchrun

TORCHRUN_SCRIPT = """
import os, sys, time
import torch.distributed as dist
import expr_tracker as et

dist.init_process_group("gloo")
rank = dist.get_rank()
if rank == 1:
    time.sleep(1.2)  # rank 1 starts its run in a later second than rank 0
run = et.init(project="p", dir=sys.argv[1], config={"rank": rank})
et.log({"rank": rank})
dist.barrier()
et.finish()
os.write(1, f"NAME {rank} {run.name}\\n".encode())  # one write: ranks share the pipe
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_torchrun_ranks_share_one_run_and_two_launches_never_do(tmp_path):
    pytest.importorskip("torch.distributed")
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(TORCHRUN_SCRIPT))
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node=2",
        "--standalone",
        str(script),
        str(tmp_path / "runs"),
    ]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK")}
    env["OMP_NUM_THREADS"] = "1"
    # two launches at once: in the same second, with nothing told apart by the user
    launches = [
        subprocess.Popen(
            cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    outs = []
    for p in launches:
        out, err = p.communicate(timeout=240)
        assert p.returncode == 0, out + err
        outs.append(out)
    names = []
    for out in outs:
        per_rank = dict(re.findall(r"^NAME (\d) (\S+)$", out, re.M))
        assert set(per_rank) == {"0", "1"}, out
        assert per_rank["0"] == per_rank["1"]  # one launch, one run
        names.append(per_rank["0"])
    assert names[0] != names[1]  # two launches, two runs
    dirs = sorted(d.name for d in (tmp_path / "runs" / "p").iterdir())
    assert dirs == sorted(names)
    for name in names:
        d = tmp_path / "runs" / "p" / name
        assert [r["rank"] for r in read_rows(d / "metrics.jsonl")] == [0]
        assert [r["rank"] for r in read_rows(d / "metrics.rank1.jsonl")] == [1]
        assert json.loads((d / "run.rank1.json").read_text())["status"] == "finished"
        assert json.loads((d / "config.json").read_text()) == {"rank": 0}  # rank 0's only
        assert json.loads((d / "spec.json").read_text())["config"] == {"rank": 0}


RANK_CHILD = """
import sys, expr_tracker as et
et.init(project="p", name="r", dir=sys.argv[1], config={"who": sys.argv[2]})
et.log({"x": 1})
et.finish()
"""


@pytest.mark.slow
def test_rank_n_never_writes_or_overwrites_run_level_files(tmp_path):
    runs = str(tmp_path / "runs")
    run_dir = tmp_path / "runs" / "p" / "r"
    rc, _, err = _finish(_spawn(RANK_CHILD, runs, "rank1-first", env={"RANK": "1"}))
    assert rc == 0, err
    assert not (run_dir / "config.json").exists() and not (run_dir / "spec.json").exists()
    rc, _, err = _finish(_spawn(RANK_CHILD, runs, "rank0", env={"RANK": "0"}))
    assert rc == 0, err
    config, spec = (run_dir / "config.json").read_bytes(), (run_dir / "spec.json").read_bytes()
    assert json.loads(config) == {"who": "rank0"}
    rc, _, err = _finish(_spawn(RANK_CHILD, runs, "rank1-again", env={"RANK": "1"}))
    assert rc == 0, err
    assert (run_dir / "config.json").read_bytes() == config
    assert (run_dir / "spec.json").read_bytes() == spec
    assert json.loads((run_dir / "run.rank1.json").read_text())["status"] == "finished"
    assert len(read_rows(run_dir / "metrics.rank1.jsonl")) == 2


# ---------------------------------------------------------------- resume, announced


def test_resume_is_announced_on_stderr_with_step_and_previous_status(tmp_path, capsys):
    kw = {"project": "proj", "name": "r1", "dir": str(tmp_path / "runs")}
    et.init(**kw)
    for i in range(3):
        et.log({"a": i})
    et.finish()
    assert "resuming" not in capsys.readouterr().err  # a new run says nothing
    run = et.init(**kw)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "resuming" in line]
    assert len(lines) == 1, err
    assert "proj/r1" in lines[0] and "at step 3" in lines[0]
    assert "previous attempt: finished" in lines[0]
    assert str(run.dir) in lines[0]
    et.finish()


def test_resume_after_a_crash_says_crashed(tmp_path):
    code = """
    import os, sys, expr_tracker as et
    et.init(project="proj", name="r1", dir=sys.argv[1], stream="data")
    et.log({"a": 1}); et.log({"a": 2})
    et.get_run().history.flush()
    if sys.argv[2] == "crash":
        os._exit(9)
    et.finish()
    """
    rc, _, _ = _finish(_spawn(code, str(tmp_path / "runs"), "crash"))
    assert rc == 9
    rc, _, err = _finish(_spawn(code, str(tmp_path / "runs"), "finish"))
    assert rc == 0, err
    lines = [line for line in err.splitlines() if "resuming" in line]
    assert len(lines) == 1, err
    assert "proj/r1 (stream data) at step 2" in lines[0]
    assert "previous attempt: crashed" in lines[0]


# ---------------------------------------------------------------- the lock comes first

HOLDER = """
import sys, time, expr_tracker as et
et.init(project="proj", name="r1", dir=sys.argv[1], config={"lr": 0.1}, buffer_size=1,
        buffer_interval=0)
for i in range(5):
    et.log({"x": i})
et.get_run().history.flush()
et.get_run().summary.save()
print("idle", flush=True)
sys.stdin.readline()            # the test compares the files, then lets us write fast
print("busy", flush=True)
n = 5
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    et.log({"x": n}); n += 1
    if n % 20 == 0:
        time.sleep(0.0005)
    import select
    if select.select([sys.stdin], [], [], 0)[0]:
        break
et.finish()
print("rows", n, flush=True)
"""


def _state(run_dir: Path) -> dict[str, tuple[bytes, int]]:
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(run_dir.iterdir())}


@pytest.mark.slow
def test_a_refused_second_process_touches_nothing_of_the_holder(tmp_path):
    run_dir = tmp_path / "runs" / "proj" / "r1"
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(HOLDER), str(tmp_path / "runs")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "idle"
        before = _state(run_dir)
        assert set(before) == {
            "run.json",
            "spec.json",
            "config.json",
            "summary.json",
            "metrics.jsonl",
            "metrics.meta.json",
            "metrics.jsonl.lock",
        }
        # (another config, or resume="never", starts r1-2 instead: see
        # test_another_config_started_while_the_named_run_is_live_gets_name_2)
        for kw in ({}, {"resume": "must"}, {"config": {"lr": 0.1}}):
            with pytest.raises(et.RunLockedError) as info:
                et.init(project="proj", name="r1", dir=str(tmp_path / "runs"), **kw)
            msg = str(info.value)
            assert f"pid={holder.pid}" in msg
            assert "name=" in msg and "stream=" in msg and "wait" in msg
        assert _state(run_dir) == before  # bytes and mtimes, every file
        # while the holder appends as fast as it can, refused starts cut nothing
        holder.stdin.write("go\n")
        holder.stdin.flush()
        assert holder.stdout.readline().strip() == "busy"
        for _ in range(40):
            with pytest.raises(et.RunLockedError):
                et.init(project="proj", name="r1", dir=str(tmp_path / "runs"))
        holder.stdin.write("stop\n")
        holder.stdin.flush()
        out, err = holder.communicate(timeout=60)
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
    assert holder.returncode == 0, err
    n = int(re.search(r"rows (\d+)", out)[1])
    assert "truncated" not in err and "deleted" not in err, err
    rows = read_rows(run_dir / "metrics.jsonl")
    assert [r["x"] for r in rows] == list(range(n))
    assert json.loads((run_dir / "run.json").read_text())["status"] == "finished"
    assert json.loads((run_dir / "config.json").read_text()) == {"lr": 0.1}


@pytest.mark.slow
def test_another_config_started_while_the_named_run_is_live_gets_name_2(tmp_path, capsys):
    """A sweep launched in parallel under one name (a Hydra multirun on joblib or SLURM,
    two terminals): the named run is being written by a live process with another config.
    That is another experiment, as when it has finished: run r1-2, not RunLockedError. The
    same config running now is refused (one experiment is not started twice)."""
    run_dir = tmp_path / "runs" / "proj" / "r1"
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(HOLDER), str(tmp_path / "runs")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "idle"
        before = _state(run_dir)
        runs = str(tmp_path / "runs")
        run = et.init(project="proj", name="r1", dir=runs, config={"lr": 0.2})
        et.log({"x": 100})
        et.finish()
        assert run.name == "r1-2"
        err = capsys.readouterr().err
        assert "run proj/r1 was started with another config (lr: 0.1 -> 0.2)" in err, err
        assert _json(run.dir / "run.json")["requested_name"] == "r1"
        run = et.init(project="proj", name="r1", dir=runs, config={"lr": 0.1}, resume="never")
        et.finish()
        assert run.name == "r1-3"
        with pytest.raises(et.RunLockedError):
            et.init(project="proj", name="r1", dir=runs, config={"lr": 0.1})
        assert _state(run_dir) == before
        holder.stdin.write("go\n")
        holder.stdin.flush()
        assert holder.stdout.readline().strip() == "busy"
        holder.stdin.write("stop\n")
        holder.stdin.flush()
        out, err = holder.communicate(timeout=60)
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
    assert holder.returncode == 0, err
    assert _json(run_dir / "config.json") == {"lr": 0.1}
    assert [r["x"] for r in read_rows(tmp_path / "runs" / "proj" / "r1-2" / "metrics.jsonl")] == [
        100
    ]


RACER = """
import sys, time, os, expr_tracker as et
# warm up (imports, rule grammar) so that the racing starts take a few milliseconds each
et.init(project="warm", name=str(os.getpid()), dir=sys.argv[1])
et.finish()
at, rounds = float(sys.argv[2]), int(sys.argv[3])
for k in range(rounds):
    time.sleep(max(0.0, at + 2.0 * k - time.time()))
    tried = os.path.join(sys.argv[1], f"tried{k}")
    try:
        # one experiment started several times at once (another config would start race{k}-2)
        et.init(project="proj", name=f"race{k}", dir=sys.argv[1], config={"lr": 0.1})
    except et.RunLockedError as e:
        print("R", k, "LOCKED", flush=True)
        open(os.path.join(tried, str(os.getpid())), "w").close()
        continue
    et.config.update({"pid": os.getpid()})
    for i in range(50):
        et.log({"pid": os.getpid(), "i": i})
    # hold the run until every other racer has tried (a loaded machine starts some late)
    os.makedirs(tried, exist_ok=True)
    end = time.time() + 120
    while len(os.listdir(tried)) < int(sys.argv[4]) - 1 and time.time() < end:
        time.sleep(0.02)
    et.finish()
    print("R", k, "WON", os.getpid(), flush=True)
"""


@pytest.mark.slow
def test_racing_starts_of_a_new_run_one_wins_and_keeps_everything(tmp_path):
    racers, rounds = 6, 4
    at = _next_second_plus(3.0)
    runs = tmp_path / "runs"
    for k in range(rounds):
        (runs / f"tried{k}").mkdir(parents=True)
    procs = [_spawn(RACER, str(runs), at, str(rounds), str(racers)) for _ in range(racers)]
    results = [_finish(p, timeout=240) for p in procs]
    for rc, out, err in results:
        assert rc == 0, out + err
        assert "deleted" not in err and "truncated" not in err, err
    lines = [line.split() for _, out, _ in results for line in out.splitlines()]
    for k in range(rounds):
        outcome = sorted(x[2] for x in lines if x[:2] == ["R", str(k)])
        assert outcome == ["LOCKED"] * (racers - 1) + ["WON"], (k, outcome)
        (winner,) = [int(x[3]) for x in lines if x[:3] == ["R", str(k), "WON"]]
        run_dir = tmp_path / "runs" / "proj" / f"race{k}"
        rows = read_rows(run_dir / "metrics.jsonl")
        assert [(r["pid"], r["i"]) for r in rows] == [(winner, i) for i in range(50)]
        assert json.loads((run_dir / "config.json").read_text()) == {"lr": 0.1, "pid": winner}
        assert json.loads((run_dir / "spec.json").read_text())["config"] == {"lr": 0.1}
        info = json.loads((run_dir / "run.json").read_text())
        assert info["status"] == "finished" and info["pid"] == winner
        assert "previous_attempts" not in info


def test_a_failed_start_removes_only_what_it_created(tmp_path, monkeypatch):
    """Another producer that appears in the run directory while this start fails keeps
    its files; the failed start leaves none of its own."""
    import expr_tracker.assemble as assemble_mod

    runs = tmp_path / "runs"
    other = """
    import sys, expr_tracker as et
    et.init(project="proj", name="r1", dir=sys.argv[1], stream="other")
    et.log({"o": 1})
    et.finish()
    """
    real = assemble_mod.build_spans

    def spans_then_fail(*args, **kwargs):
        real(*args, **kwargs)
        rc, _, err = _finish(_spawn(other, str(runs)))
        assert rc == 0, err
        raise RuntimeError("construction fails after another producer started")

    monkeypatch.setattr(assemble_mod, "build_spans", spans_then_fail)
    with pytest.raises(RuntimeError, match="construction fails"):
        et.init(project="proj", name="r1", dir=str(runs))
    run_dir = runs / "proj" / "r1"
    names = sorted(p.name for p in run_dir.iterdir())
    assert [r["o"] for r in read_rows(run_dir / "metrics.other.jsonl")] == [1]
    assert "run.other.json" in names and "config.other.json" in names
    assert not [n for n in names if n.startswith(("metrics.jsonl", "run.json", "summary.json"))]
    assert "config.json" not in names
    monkeypatch.undo()
    et.init(project="proj", name="r1", dir=str(runs), resume="never")  # nothing half-made
    et.finish()


# ---------------------------------------------------------------- bounded names


@pytest.mark.parametrize(
    "field,value,limit",
    [("name", "n" * 201, "200"), ("project", "p" * 201, "200"), ("stream", "s" * 65, "64")],
)
def test_too_long_names_are_spec_errors_naming_field_and_limit(tmp_path, field, value, limit):
    kw = {"project": "proj", "name": "r1", "dir": str(tmp_path / "runs"), field: value}
    with pytest.raises(SpecError) as info:
        et.init(**kw)
    text = str(info.value)
    assert field in [i.path for i in info.value.issues], text
    assert f"at most {limit}" in text
    assert not (tmp_path / "runs").exists()


def test_longest_allowed_names_write_every_file(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "1234567")
    run = et.init(
        project="p" * 200,
        name="é" * 100,  # 200 bytes in UTF-8
        dir=str(tmp_path),
        stream="s" * 64,
        alert_rules=["x > 1 => warning: big"],
    )
    with et.span("step"):
        et.log({"x": 2})
    et.finish()
    names = {p.name for p in run.dir.iterdir()}
    suffix = "s" * 64 + ".rank1234567"
    for kind in ("metrics", "spans", "alerts"):
        assert f"{kind}.{suffix}.jsonl" in names, names
    assert f"metrics.{suffix}.meta.json" in names and f"metrics.{suffix}.jsonl.lock" in names
    assert f"run.{suffix}.json" in names and f"summary.{suffix}.json" in names


@pytest.mark.parametrize("stream", ["rank1", "rank0", "RANK12"])
def test_a_stream_named_like_a_rank_shard_is_rejected(tmp_path, stream):
    with pytest.raises(SpecError) as info:
        et.init(project="proj", name="r1", dir=str(tmp_path / "runs"), stream=stream)
    assert "stream" in [i.path for i in info.value.issues]
    assert "rank suffix" in str(info.value)
    assert not (tmp_path / "runs").exists()
    from expr_tracker.history.paths import resolve_run_path

    (tmp_path / "d").mkdir()
    with pytest.raises(ValueError, match="rank suffix"):
        resolve_run_path(tmp_path / "d", stream=stream)


# ---------------------------------------------------------------- reruns decide by the config


def _err_lines(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if "expr_tracker:" in line]


def _start(tmp_path, config, **kw):
    kw = {"project": "proj", "name": "gpt2", "dir": str(tmp_path / "runs"), **kw}
    run = et.init(config=config, **kw)
    et.log({"lr": config.get("lr") if config else None})
    et.finish()
    return run


def _json(path: Path):
    return json.loads(path.read_text())


def test_the_same_config_resumes_another_starts_name_2(tmp_path, capsys):
    runs = tmp_path / "runs" / "proj"
    assert _start(tmp_path, {"lr": 0.1, "n": 2}).name == "gpt2"
    assert _err_lines(capsys) == []
    assert _start(tmp_path, {"lr": 0.1, "n": 2}).name == "gpt2"  # a restart: the same run
    (line,) = _err_lines(capsys)
    assert "resuming run proj/gpt2 at step 1; previous attempt: finished" in line

    assert _start(tmp_path, {"lr": 0.2, "n": 2}).name == "gpt2-2"
    (line,) = _err_lines(capsys)
    assert line.startswith("expr_tracker: run proj/gpt2 was started with another config")
    assert "(lr: 0.1 -> 0.2)" in line and "starting run proj/gpt2-2" in line
    assert "to continue proj/gpt2 instead, pass resume='must'" in line
    assert _json(runs / "gpt2" / "config.json") == {"lr": 0.1, "n": 2}  # untouched
    assert _json(runs / "gpt2-2" / "config.json") == {"lr": 0.2, "n": 2}
    assert [r["lr"] for r in read_rows(runs / "gpt2" / "metrics.jsonl")] == [0.1, 0.1]
    assert _json(runs / "gpt2-2" / "run.json")["requested_name"] == "gpt2"

    # that config again continues gpt2-2; a third one takes the first free name
    assert _start(tmp_path, {"lr": 0.2, "n": 2}).name == "gpt2-2"
    (line,) = _err_lines(capsys)
    assert "resuming run proj/gpt2-2 at step 1" in line and "this config" in line
    assert _start(tmp_path, {"lr": 0.3, "n": 3}).name == "gpt2-3"
    (line,) = _err_lines(capsys)
    assert "(lr: 0.1 -> 0.3, n: 2 -> 3)" in line
    assert [r["lr"] for r in read_rows(runs / "gpt2-2" / "metrics.jsonl")] == [0.2, 0.2]


def test_keys_added_during_the_run_never_make_a_restart_look_different(tmp_path, capsys):
    kw = {"project": "proj", "name": "r", "dir": str(tmp_path / "runs")}
    et.init(config={"lr": 0.1}, **kw)
    et.config.update({"best_epoch": 3, "n_params": 1234})  # added by the run itself
    et.finish()
    run = et.init(config={"lr": 0.1}, **kw)
    assert run.name == "r" and run.resumed
    assert dict(run.config) == {"lr": 0.1, "best_epoch": 3, "n_params": 1234}
    et.finish()


def test_a_start_given_no_config_continues_and_keeps_the_compared_config(tmp_path, capsys):
    """An evaluation script (et.init(name=...) alone) continues the run; the training script
    restarted after it with its own config still resumes, another config still moves on."""
    runs = tmp_path / "runs" / "proj"
    kw = {"project": "proj", "name": "r", "dir": str(tmp_path / "runs")}
    et.init(config={"lr": 0.1}, **kw)
    et.log({"loss": 1.0})
    et.finish()
    run = et.init(**kw)  # no config: nothing says this is another experiment
    assert run.name == "r" and run.resumed
    assert dict(run.config) == {"lr": 0.1}
    et.finish()
    info = _json(runs / "r" / "run.json")
    assert info["init_config"] == {"lr": 0.1} and "config_changes" not in info
    assert _start(tmp_path, {"lr": 0.1}, name="r").name == "r"
    assert _start(tmp_path, {"lr": 0.2}, name="r").name == "r-2"
    capsys.readouterr()


def test_must_continues_another_config_and_records_it_per_attempt(tmp_path, capsys):
    run_dir = tmp_path / "runs" / "proj" / "gpt2"
    _start(tmp_path, {"lr": 0.1, "seed": 1})
    _start(tmp_path, {"lr": 0.2, "seed": 1}, resume="must")
    (line,) = _err_lines(capsys)
    assert "resuming run proj/gpt2 at step 1" in line
    assert "config changed since: lr: 0.1 -> 0.2" in line
    info = _json(run_dir / "run.json")
    assert info["config_changes"] == {"lr": {"before": 0.1, "after": 0.2}}
    assert info["init_config"] == {"lr": 0.2, "seed": 1}
    _start(tmp_path, {"lr": 0.3}, resume="must")
    info = _json(run_dir / "run.json")
    assert info["config_changes"] == {
        "lr": {"before": 0.2, "after": 0.3},
        "seed": {"before": 1},
    }
    assert [a.get("config_changes") for a in info["previous_attempts"]] == [
        None,
        {"lr": {"before": 0.1, "after": 0.2}},
    ]
    # config.json holds the latest values given (keys no longer given stay)
    assert _json(run_dir / "config.json") == {"lr": 0.3, "seed": 1}
    assert [r["lr"] for r in read_rows(run_dir / "metrics.jsonl")] == [0.1, 0.2, 0.3]
    # and the latest attempt is what the next start compares with
    assert _start(tmp_path, {"lr": 0.3}).name == "gpt2"


def test_never_always_starts_a_new_run(tmp_path, capsys):
    names = [_start(tmp_path, {"lr": 0.1}, resume="never").name for _ in range(3)]
    assert names == ["gpt2", "gpt2-2", "gpt2-3"]
    lines = _err_lines(capsys)
    assert len(lines) == 2 and "run proj/gpt2 exists (resume='never')" in lines[1]
    assert "starting run proj/gpt2-3" in lines[1]


def test_id_and_run_dir_fix_the_run_whatever_the_config(tmp_path, capsys):
    runs = str(tmp_path / "runs")
    for lr in (0.1, 0.2):
        run = et.init(project="proj", id="abc", dir=runs, config={"lr": lr})  # wandb's id
        et.finish()
        assert run.name == "abc"
    info = _json(run.dir / "run.json")
    assert info["config_changes"] == {"lr": {"before": 0.1, "after": 0.2}}
    folder = tmp_path / "mine"
    for lr in (0.1, 0.2):
        run = et.init(project="proj", run_dir=str(folder), config={"lr": lr})
        et.finish()
        assert run.dir == folder
    assert _json(folder / "run.json")["config_changes"] == {"lr": {"before": 0.1, "after": 0.2}}


ADDRESSED = """
import functools, sys, expr_tracker as et


def collate(batch, pad=0):
    return batch


class Settings:  # no __repr__ of its own: "<__main__.Settings object at 0x...>"
    pass


act = sys.argv[2]
run = et.init(project="proj", name="obj", dir=sys.argv[1], config={
    "lr": 0.1, "collate": functools.partial(collate, pad=1), "act": {"a": lambda x: x,
    "b": print}[act], "settings": Settings()})
et.log({"x": 1})
et.finish()
print("RUN", run.name)
"""


@pytest.mark.slow
def test_values_named_by_an_address_compare_by_what_they_name(tmp_path):
    """A config holding a function, a partial or an object without a __repr__ is recorded as
    its repr(), which holds a memory address: another text in every process. The same
    script again is the same config (not obj-2, obj-3 ... at every restart); a value that
    names something else (another function) is still another config."""
    runs = str(tmp_path / "runs")
    names = []
    for act in ("a", "a", "b"):
        p = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(ADDRESSED), runs, act],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert p.returncode == 0, p.stderr
        names.append(re.search(r"^RUN (\S+)$", p.stdout, re.M)[1])
    assert names == ["obj", "obj", "obj-2"], names
    assert "act: " in p.stderr and "collate" not in p.stderr.split("another config")[1], p.stderr


@pytest.mark.parametrize(
    ("kw", "hint"),
    [
        ({"id": "abc"}, "give another one to start anew"),
        ({"name": "gpt2", "resume": "must"}, None),
        ({"name": "gpt2"}, "another name, or resume='never', starts anew"),
    ],
)
def test_the_resume_line_gives_advice_that_holds_for_the_start(tmp_path, capsys, kw, hint):
    """The resume line's advice fits how the run was chosen: with wandb's id= (or run_dir=)
    resume='never' is an error, so it is not offered; resume='must' asked to continue."""
    _start(tmp_path, {"lr": 0.1}, **{k: v for k, v in kw.items() if k != "resume"})
    _err_lines(capsys)
    _start(tmp_path, {"lr": 0.1}, **kw)
    (line,) = _err_lines(capsys)
    assert "resuming run" in line
    if hint is None:
        assert "starts anew" not in line and "start anew" not in line, line
    else:
        assert hint in line, line
    if "id" in kw:
        assert "resume='never'" not in line, line


def test_a_run_from_before_init_configs_were_recorded_is_compared_by_its_config_json(
    tmp_path,
):
    run_dir = tmp_path / "runs" / "proj" / "gpt2"
    _start(tmp_path, {"lr": 0.1})
    et.init(project="proj", name="gpt2", dir=str(tmp_path / "runs"), config={"lr": 0.1})
    et.config.update({"added": 1})
    et.finish()
    info = _json(run_dir / "run.json")
    del info["init_config"]  # as an earlier version wrote it
    (run_dir / "run.json").write_text(json.dumps(info))
    assert _start(tmp_path, {"lr": 0.1}).name == "gpt2"  # config.json's extra key: no change
    info = _json(run_dir / "run.json")
    del info["init_config"]
    (run_dir / "run.json").write_text(json.dumps(info))
    assert _start(tmp_path, {"lr": 0.5}).name == "gpt2-2"


def test_changed_keys_are_named_a_few_then_counted():
    from expr_tracker.assemble.identity import config_changes, describe_changes

    before = {"optim": {"lr": 0.1, "betas": [0.9, 0.99]}, "a": 1, "b": 2, "c": 3, "gone": 0}
    after = {"optim": {"lr": 0.2, "betas": [0.9, 0.95]}, "a": 2, "b": 2, "c": 4, "new": 5}
    changes = config_changes(before, after)
    assert list(changes) == ["optim.lr", "optim.betas", "a", "c", "new", "gone"]
    assert changes["new"] == {"after": 5} and changes["gone"] == {"before": 0}
    assert describe_changes(changes) == (
        "optim.lr: 0.1 -> 0.2, optim.betas: [0.9, 0.99] -> [0.9, 0.95], a: 1 -> 2 and 3 more"
    )
    assert config_changes({"x": float("nan")}, {"x": float("nan")}) == {}


MOVER = """
import sys, time, os, expr_tracker as et
et.init(project="warm", name=str(os.getpid()), dir=sys.argv[1])
et.finish()
time.sleep(max(0.0, float(sys.argv[2]) - time.time()))
try:
    run = et.init(project="proj", name="gpt2", dir=sys.argv[1], config={"lr": 0.2})
except et.RunLockedError:
    print("LOCKED", flush=True)
    sys.exit(0)
for i in range(20):
    et.log({"pid": os.getpid(), "i": i})
time.sleep(1.0)  # hold the run while the others look for a free name
et.finish()
print("RUN", run.name, os.getpid(), flush=True)
"""


@pytest.mark.slow
def test_racing_starts_with_another_config_never_share_a_new_run(tmp_path):
    """gpt2 exists with lr 0.1; several processes with lr 0.2 start at once: each gets a
    run of its own (gpt2-2, gpt2-3 ...) or is refused while another probes gpt2; no two
    share one, and gpt2 is untouched."""
    _start(tmp_path, {"lr": 0.1})
    at = _next_second_plus(3.0)
    procs = [_spawn(MOVER, str(tmp_path / "runs"), at) for _ in range(4)]
    results = [_finish(p, timeout=240) for p in procs]
    won = {}
    for rc, out, err in results:
        assert rc == 0, out + err
        m = re.search(r"^RUN (\S+) (\d+)$", out, re.M)
        if m:
            assert m[1] not in won, (m[1], results)  # never shared
            won[m[1]] = int(m[2])
        else:
            assert "LOCKED" in out
    assert won and all(re.fullmatch(r"gpt2-\d+", n) for n in won)
    for name, pid in won.items():
        run_dir = tmp_path / "runs" / "proj" / name
        rows = read_rows(run_dir / "metrics.jsonl")
        assert [(r["pid"], r["i"]) for r in rows] == [(pid, i) for i in range(20)]
        assert _json(run_dir / "config.json") == {"lr": 0.2}
        assert "previous_attempts" not in _json(run_dir / "run.json")
    base = tmp_path / "runs" / "proj" / "gpt2"
    assert [r["lr"] for r in read_rows(base / "metrics.jsonl")] == [0.1]
    assert _json(base / "config.json") == {"lr": 0.1}


TORCHRUN_RERUN = """
import os, sys, time
import torch.distributed as dist
import expr_tracker as et

dist.init_process_group("gloo")
rank = dist.get_rank()
if rank == 0:
    time.sleep(1.5)  # rank 1 reaches et.init first: it waits for rank 0's choice
run = et.init(project="p", name="fixed", dir=sys.argv[1],
              config={"lr": float(sys.argv[2]), "rank": rank})
et.log({"rank": rank, "lr": float(sys.argv[2])})
dist.barrier()
et.finish()
os.write(1, f"NAME {rank} {run.name}\\n".encode())
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_torchrun_ranks_follow_rank_0_to_name_2(tmp_path):
    """Two launches under one name, the second with another lr: rank 0 chooses fixed-2 and
    rank 1 (which started first, with a config of its own) follows it there."""
    pytest.importorskip("torch.distributed")
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(TORCHRUN_RERUN))
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK")}
    env["OMP_NUM_THREADS"] = "1"
    names = []
    for lr in ("0.1", "0.2"):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2"]
        cmd += ["--standalone", str(script), str(tmp_path / "runs"), lr]
        p = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
        assert p.returncode == 0, p.stdout + p.stderr
        per_rank = dict(re.findall(r"^NAME (\d) (\S+)$", p.stdout, re.M))
        assert per_rank["0"] == per_rank["1"], p.stdout
        names.append(per_rank["0"])
    assert names == ["fixed", "fixed-2"]
    for name, lr in zip(names, (0.1, 0.2), strict=True):
        d = tmp_path / "runs" / "p" / name
        assert [(r["rank"], r["lr"]) for r in read_rows(d / "metrics.jsonl")] == [(0, lr)]
        assert [(r["rank"], r["lr"]) for r in read_rows(d / "metrics.rank1.jsonl")] == [(1, lr)]
        assert _json(d / "config.json") == {"lr": lr, "rank": 0}


HYDRA_NAMED_CONFIG = """
defaults:
  - tracker: default
  - _self_
lr: 0.1
tracker:
  project: sweep
  name: exp
"""


@pytest.mark.slow
def test_hydra_multirun_under_one_spec_name_gives_each_config_its_run(tmp_path):
    """Without the job callback every job of `-m` calls et.init under the spec's one name:
    each config gets its own run (exp, exp-2), and the same sweep again continues them."""
    pytest.importorskip("hydra")
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "config.yaml").write_text(HYDRA_NAMED_CONFIG)
    (tmp_path / "app.py").write_text(textwrap.dedent(HYDRA_APP))
    for _ in range(2):
        proc = subprocess.run(
            [sys.executable, "app.py", "-m", "lr=0.1,0.2"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert proc.returncode == 0, proc.stderr
    assert re.findall(r"^RUN (\S+) (\S+)$", proc.stdout, re.M) == [("exp", "0.1"), ("exp-2", "0.2")]
    for name, lr in (("exp", 0.1), ("exp-2", 0.2)):
        d = tmp_path / "runs" / "sweep" / name
        assert [r["lr"] for r in read_rows(d / "metrics.jsonl")] == [lr, lr]
        assert _json(d / "config.json")["lr"] == lr
