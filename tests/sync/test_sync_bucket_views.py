"""A bucket's local copy as the bucket is now (docs/team.md "Reading the bucket"): ``et runs``
of a project or a run URL lists that project or run; a run whose manifests are gone from the
bucket leaves the copy at the next refresh (never anything outside the copy, links included);
``et plot --runs`` takes run URLs; the dashboard's runs page shows a failed refresh."""

from __future__ import annotations

import json
import os

import pytest

import expr_tracker as et
from expr_tracker.cli.main import main
from expr_tracker.sync.mirror import mirror
from expr_tracker.sync.upload import sync_dir

pytest.importorskip("pyarrow")


def train(root, name, *, project="proj", steps=5):
    et.init(project=project, name=name, dir=str(root), system=False)
    for i in range(steps):
        et.log({"loss": 1.0 / (i + 1)})
    et.finish()


def _runs(capsys, url) -> list[str]:
    assert main(["runs", url, "--format", "json"]) == 0
    return sorted(r["run"] for r in json.loads(capsys.readouterr().out))


@pytest.fixture
def three_runs(s3_bucket, tmp_path):
    """proj/a, proj/b and other/c synced to a fresh S3 bucket (moto_server)."""
    train(tmp_path / "runs", "a")
    train(tmp_path / "runs", "b")
    train(tmp_path / "runs", "c", project="other")
    assert sync_dir(tmp_path / "runs", s3_bucket.url, state_dir=tmp_path / "s").errors == []
    return s3_bucket


def test_et_runs_of_a_project_or_run_url_lists_only_that(three_runs, capsys):
    url = three_runs.url
    assert _runs(capsys, url) == ["other/c", "proj/a", "proj/b"]
    assert _runs(capsys, f"{url}/proj") == ["proj/a", "proj/b"]
    assert _runs(capsys, f"{url}/proj/b") == ["proj/b"]
    assert _runs(capsys, f"{url}/other/") == ["other/c"]
    assert main(["runs", f"{url}/nothing"]) == 1
    assert "no run synced there" in capsys.readouterr().err


def _delete_run(bucket, project, run) -> None:
    """What removing a run from the bucket by hand leaves: its manifests gone."""
    import boto3

    s3 = boto3.client("s3", endpoint_url=bucket.endpoint)
    prefix = f"{bucket.prefix}/_manifests/project={project}/run={run}/"
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket.bucket, Prefix=prefix)["Contents"]]
    assert keys
    s3.delete_objects(Bucket=bucket.bucket, Delete={"Objects": [{"Key": k} for k in keys]})


def test_a_run_gone_from_the_bucket_leaves_the_copy(three_runs, capsys):
    url = three_runs.url
    assert _runs(capsys, url) == ["other/c", "proj/a", "proj/b"]
    _delete_run(three_runs, "proj", "b")
    assert _runs(capsys, url) == ["other/c", "proj/a"]
    # the project's and the run's views follow too
    _delete_run(three_runs, "other", "c")
    assert _runs(capsys, f"{url}/proj") == ["proj/a"]
    assert _runs(capsys, url) == ["proj/a"]


def test_the_dashboard_drops_a_run_gone_from_the_bucket(three_runs, monkeypatch):
    TestClient = pytest.importorskip("starlette.testclient").TestClient
    from expr_tracker.cli.ui import _bucket
    from expr_tracker.ui import server

    monkeypatch.setattr(server, "REFRESH_TTL", 0.0)
    root, refresh = _bucket(f"{three_runs.url}/proj", None)
    client = TestClient(server.create_app(root, token=None, refresh=refresh, source="x"),
                        base_url="http://127.0.0.1")  # fmt: skip
    assert sorted(r["run"] for r in client.get("/api/runs").json()["runs"]) == ["proj/a", "proj/b"]
    _delete_run(three_runs, "proj", "a")
    assert [r["run"] for r in client.get("/api/runs").json()["runs"]] == ["proj/b"]
    assert client.get("/api/run", params={"run": "proj/a"}).status_code == 404


def test_dropping_runs_never_deletes_outside_the_copy(tmp_path):
    """A hostile copy folder: a project and a run that are links to folders elsewhere, and a
    run (gone from the bucket) holding a link to a folder elsewhere."""
    train(tmp_path / "runs", "a")
    train(tmp_path / "runs", "gone")
    url = f"file://{tmp_path / 'bucket'}"
    assert sync_dir(tmp_path / "runs", url, state_dir=tmp_path / "s").errors == []
    copy = tmp_path / "copy"
    assert mirror(url, cache_dir=copy).problems == []
    outside = tmp_path / "outside"
    (outside / "victim").mkdir(parents=True)
    (outside / "victim" / "metrics.jsonl").write_text("{}\n")
    os.symlink(outside, copy / "linked-project")
    os.symlink(outside / "victim", copy / "proj" / "linked-run")
    os.symlink(outside, copy / "proj" / "gone" / "inner-link")
    for name in os.listdir(tmp_path / "bucket" / "_manifests" / "project=proj" / "run=gone"):
        os.unlink(tmp_path / "bucket" / "_manifests" / "project=proj" / "run=gone" / name)
    res = mirror(url, cache_dir=copy)
    assert not (copy / "proj" / "gone").exists()
    assert (copy / "proj" / "a" / "metrics.jsonl").is_file()
    assert (outside / "victim" / "metrics.jsonl").read_text() == "{}\n"
    assert (copy / "linked-project").is_symlink() and (copy / "proj" / "linked-run").is_symlink()
    assert res.dropped == 1


def test_a_bucket_folder_gone_is_an_error_not_an_empty_bucket(tmp_path):
    from expr_tracker.sync.store import StoreError

    train(tmp_path / "runs", "a")
    url = f"file://{tmp_path / 'bucket'}"
    assert sync_dir(tmp_path / "runs", url, state_dir=tmp_path / "s").errors == []
    copy = tmp_path / "copy"
    mirror(url, cache_dir=copy)
    (tmp_path / "bucket").rename(tmp_path / "unmounted")
    with pytest.raises(StoreError, match="not a folder"):
        mirror(url, cache_dir=copy)
    assert (copy / "proj" / "a" / "metrics.jsonl").is_file()


def test_et_plot_runs_takes_run_urls(three_runs, capsys):
    pytest.importorskip("plotext")
    url = three_runs.url
    runs = f"{url}/proj/a,{url}/other/c,proj/b"  # two URLs and a name under --dir
    args = ["--dir", url, "--width", "60", "--height", "12", "--no-color"]
    assert main(["plot", "--runs", runs, "loss", *args]) == 0
    out = capsys.readouterr().out  # labelled as local runs are: the fewest trailing parts
    assert all(f"{r}/loss: 5 points" in out for r in ("a", "b", "c")), out
    assert main(["plot", "--runs", f"{url}/proj/zz,proj/a", *args]) == 1
    assert "no run synced there" in capsys.readouterr().err


def test_et_sync_exits_1_when_a_media_file_was_left_out(tmp_path, capsys):
    run = tmp_path / "runs" / "proj" / "r1"
    (run / "media").mkdir(parents=True)
    os.mkfifo(run / "media" / f"{'0' * 64}.png")
    (run / "metrics.jsonl").write_text(json.dumps({"_step": 0, "_time": 1.0, "loss": 1}) + "\n")
    url = f"file://{tmp_path / 'bucket'}"
    assert main(["sync", str(tmp_path / "runs"), url]) == 1
    got = capsys.readouterr()
    assert "cannot be read" in got.err and "1 media file(s) not synced" in got.out
    assert "1 commit(s)" in got.out  # the run's lines went all the same


@pytest.mark.parametrize(
    ("sync", "shown", "hidden"),
    [
        ({"url": "ftp://host/x"}, "'ftp://host/x'", None),
        ({"url": "s3://AKIAKEY:s3cr3t@bucket/p"}, "'s3://***@bucket/p'", "s3cr3t"),
        ({"url": "s3://bucket/p?X-Amz-Signature=abc"}, "'s3://bucket/p?***'", "abc"),
        ({"url": "s3://b/p", "interval": -1}, "at least 0.1 s", ">= 0"),
        ({"url": "s3://b/p", "interval": "-5s"}, "at least 0.1 s", ">= 0"),
    ],
)
def test_sync_spec_errors_show_the_url_but_its_secrets(tmp_path, sync, shown, hidden):
    from expr_tracker.spec import SpecError

    with pytest.raises(SpecError) as err:
        et.init(project="p", name="n", dir=str(tmp_path), sync=sync, system=False)
    text = str(err.value)
    assert shown in text, text
    assert hidden is None or hidden not in text, text
