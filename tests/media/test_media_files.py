"""Histograms as .npz and tables as Parquet under media/ (docs/media.md "Storage layout"):
exact round trips, the same bytes for the same content, the size bound, hostile files
refused by the readers, and runs written before (inline histograms, .table.json tables)
still read by every reader."""

from __future__ import annotations

import hashlib
import io
import json
import logging
import zipfile
from pathlib import Path

import numpy as np
import pytest

import expr_tracker as et
from expr_tracker.history.values import media_label
from expr_tracker.media import load_histogram, load_table, parquet
from expr_tracker.media.npz import decode_histogram, encode_histogram

pa = pytest.importorskip("pyarrow")
pytest.importorskip("pyarrow.parquet")  # pa.parquet below: a submodule, loaded on import
pd = pytest.importorskip("pandas")


def _init(tmp_path, name="r"):
    return et.init(project="p", name=name, dir=str(tmp_path / "runs"), system=False)


def _plant(run_dir: Path, data: bytes, ext: str) -> dict:
    """A file named by its hash in the run's media folder, and a reference to it."""
    sha = hashlib.sha256(data).hexdigest()
    (run_dir / "media").mkdir(parents=True, exist_ok=True)
    (run_dir / "media" / f"{sha}.{ext}").write_bytes(data)
    return {"path": f"media/{sha}.{ext}", "sha256": sha}


# -- round trips ------------------------------------------------------------------------------


def test_histogram_counts_come_back_exact_and_the_row_stays_small(tmp_path):
    run = _init(tmp_path)
    big = np.array([2**62 + 1, 0, 7], dtype=np.int64)  # beyond float64's exact integers
    edges = np.array([-1.5, 0.1, 0.2, 1e300])
    density = np.array([0.25, 0.5, 0.125])
    et.log({"big": et.Histogram(np_histogram=(big, edges)), "dens": (density, edges)})
    et.log({"w": et.Histogram(np.arange(1000) % 7, num_bins=7)})
    rows = et.history()
    et.finish()
    counts, back = load_histogram(run.dir, rows[0]["big"])
    assert counts.dtype == np.int64 and counts.tolist() == big.tolist()
    assert back.tolist() == edges.tolist()
    d, _ = load_histogram(run.dir, rows[0]["dens"])
    assert d.dtype == np.float64 and d.tolist() == density.tolist()
    ref = rows[1]["w"]
    assert (ref["num_bins"], ref["count"], ref["min"], ref["max"]) == (7, 1000, 0.0, 6.0)
    assert load_histogram(run.dir, ref)[0].tolist() == np.bincount(np.arange(1000) % 7).tolist()
    assert media_label(ref) == "<histogram 7 bins>"
    line = (run.dir / "metrics.jsonl").read_text().splitlines()[1]
    assert len(line) < 300  # a reference, not 7 counts and 8 edges... nor 512 of them
    # an ordinary .npz: NumPy itself reads it, without pickle
    with np.load(run.dir / ref["path"], allow_pickle=False) as z:
        assert sorted(z.files) == ["counts", "edges"] and z["counts"].sum() == 1000


def test_a_histogram_of_values_a_few_ulps_apart_is_kept():
    # NumPy cannot cut [1, 1 + 1 ulp] into 64 bins and raised out of et.Histogram
    for a in ([1.0, np.nextafter(1.0, 2.0)], [1e300, 1e300 * (1 + 1e-15)], [-3.0, -3.0 + 4e-16]):
        h = et.Histogram(np.array(a))
        assert int(h.counts.sum()) == 2 and len(h.counts) == 64
        assert h.edges[0] <= min(a) and max(a) <= h.edges[-1]
        counts, edges = decode_histogram(encode_histogram(h.counts, h.edges))
        assert (counts == h.counts).all() and (np.diff(edges) > 0).all()


def test_the_same_histogram_is_the_same_file_whenever_it_is_written():
    counts, edges = np.histogram(np.random.default_rng(1).normal(size=500), bins=32)
    a = encode_histogram(counts, edges)
    assert a == encode_histogram(counts.astype(np.int32), edges)  # dtype normalised
    with zipfile.ZipFile(io.BytesIO(a)) as zf:
        assert {i.date_time for i in zf.infolist()} == {(1980, 1, 1, 0, 0, 0)}
    h1 = et.Histogram(np_histogram=(counts, edges)).to_ref(None)
    h2 = et.Histogram(np_histogram=(counts.tolist(), edges.tolist())).to_ref(None)
    assert h1["sha256"] == h2["sha256"] == hashlib.sha256(a).hexdigest()


def test_a_table_comes_back_as_the_same_dataframe(tmp_path):
    run = _init(tmp_path)
    df = pd.DataFrame(
        {
            "i8": np.array([1, -2, 3], dtype=np.int8),
            "u16": np.array([0, 65535, 7], dtype=np.uint16),
            "i64": np.array([2**62, 0, -1], dtype=np.int64),
            "f32": np.array([0.5, np.nan, -1.25], dtype=np.float32),
            "f64": [np.inf, 1e-300, 2.0],
            "b": [True, False, True],
            "s": ["a", "ü", "c"],
        }
    )
    img = et.Image(np.zeros((2, 3), dtype=np.uint8))
    mixed = et.Table(
        columns=["n", "img", "mix", "huge", "none"],
        data=[[1, img, 1, 2**70, None], [2, None, "x", 1, None]],
    )
    et.log({"df": et.Table(dataframe=df), "mixed": mixed})
    row = et.history()[0]
    et.finish()
    assert row["df"]["path"].endswith(".parquet") and row["df"]["columns"] == list(df.columns)
    assert (row["df"]["nrows"], row["df"]["ncols"]) == (3, 7)
    pd.testing.assert_frame_equal(load_table(run.dir, row["df"]), df)
    back = load_table(run.dir, row["mixed"], output_type="dict")
    assert back["columns"] == ["n", "img", "mix", "huge", "none"]
    assert back["data"][0][1]["_type"] == "image" and back["data"][0][1]["width"] == 3
    assert [r[2] for r in back["data"]] == [1, "x"]  # mixed kinds kept as they were
    assert back["data"][0][3] == 2**70 and back["data"][1][4] is None
    # pandas' missing values of nullable columns are missing cells
    nullable = pd.DataFrame({"a": pd.array([1, None], dtype="Int64"), "t": [pd.NaT, pd.NaT]})
    assert et.Table(dataframe=nullable).data == [[1, None], [None, None]]
    # the same table, the same file
    again = et.Table(dataframe=df).to_ref(None)
    assert again["sha256"] == row["df"]["sha256"]
    assert media_label(row["mixed"]) == "<table 2x5>"


def test_a_row_added_to_a_dataframe_table_keeps_its_values(tmp_path):
    # Arrow cast 3.5 into an int32 column as 3 and 1e300 into a float32 one as inf
    df = pd.DataFrame({"i": np.array([1], np.int32), "f": np.array([0.5], np.float32)})
    kept = et.Table(dataframe=df)
    grown = et.Table(dataframe=df)
    grown.add_data(3.5, 1e300)
    mixed = et.Table(dataframe=df)
    mixed.add_data(2, True)
    run = _init(tmp_path)
    et.log({"kept": kept, "grown": grown, "mixed": mixed})
    row = et.history()[0]
    et.finish()
    back = load_table(run.dir, row["kept"])
    assert back.dtypes.astype(str).tolist() == ["int32", "float32"]
    assert load_table(run.dir, row["grown"], output_type="dict")["data"] == [[1, 0.5], [3.5, 1e300]]
    cells = load_table(run.dir, row["mixed"], output_type="dict")["data"]
    assert cells == [[1, 0.5], [2, True]] and cells[1][1] is True


def test_without_pyarrow_a_table_is_kept_as_json(tmp_path, monkeypatch):
    """A wandb.Table logged where pyarrow is missing is never dropped: it goes to the JSON
    file every reader reads (the format of runs written before Parquet)."""
    import sys

    _init(tmp_path)
    for mod in ("pyarrow", "pyarrow.parquet", "pyarrow.compute"):
        monkeypatch.setitem(sys.modules, mod, None)  # import pyarrow raises ImportError
    et.log({"t": et.Table(columns=["a", "b"], data=[[1, "x"], [2.5, None]])})
    row = et.history()[0]
    run_dir = Path(et.info()["dir"])
    et.finish()
    assert row["t"]["path"].endswith(".table.json")
    monkeypatch.undo()
    assert load_table(run_dir, row["t"], output_type="dict") == {
        "columns": ["a", "b"],
        "data": [[1, "x"], [2.5, None]],
    }


def test_past_the_bound_a_histogram_or_table_is_dropped_with_one_error(tmp_path, caplog):
    run = _init(tmp_path)
    run.media.max_bytes = 1500
    with caplog.at_level(logging.ERROR, logger="expr_tracker"):
        for i in range(4):
            et.log({"h": et.Histogram(np.arange(100) + i), "t": et.Table(data=[[i]])})
    rows = et.history()
    et.finish()
    assert rows[0]["h"]["path"] and [r.get("h") for r in rows[2:]] == [None, None]
    assert len([r for r in caplog.records if "media.max_bytes" in r.getMessage()]) == 1
    assert et.read_history(run.dir)[3].get("t") is None


def test_a_table_past_the_readers_bounds_is_dropped_not_kept_unreadable(tmp_path, monkeypatch):
    monkeypatch.setattr(parquet, "MAX_COLUMNS", 3)
    monkeypatch.setattr(parquet, "MAX_TABLE_BYTES", 1000)
    run = _init(tmp_path)
    et.log({"wide": et.Table(columns=list("abcd"), data=[[1, 2, 3, 4]])})
    et.log({"long": et.Table(columns=["x"], data=[[i] for i in range(200)])})  # 1.6 KB
    et.log({"text": et.Table(columns=["s"], data=[["y" * 600], ["z" * 600]])})
    et.log({"ok": et.Table(columns=list("abc"), data=[[1, "x", 2.5]])})
    rows = et.history()
    et.finish()
    assert [r.get(k) for r, k in zip(rows[:3], ("wide", "long", "text"), strict=True)] == [None] * 3
    assert load_table(run.dir, rows[3]["ok"], output_type="dict")["data"] == [[1, "x", 2.5]]
    assert len(list((Path(run.dir) / "media").iterdir())) == 1


def test_a_table_file_larger_than_the_readers_read_is_dropped(tmp_path, monkeypatch):
    from expr_tracker.media import read

    monkeypatch.setattr(read, "MAX_READ_BYTES", 2000)
    run = _init(tmp_path)
    noise = np.random.default_rng(0).random(400)  # 3.2 KB of incompressible floats
    et.log({"t": et.Table(columns=["x"], data=[[float(v)] for v in noise])})
    et.log({"small": et.Table(columns=["x"], data=[[1.0]])})
    rows = et.history()
    et.finish()
    assert rows[0].get("t") is None
    assert load_table(run.dir, rows[1]["small"], output_type="dict")["data"] == [[1.0]]


# -- hostile files ---------------------------------------------------------------------------


def _zip(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return buf.getvalue()


def _npy(a, allow_pickle=False) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a, allow_pickle=allow_pickle)
    return buf.getvalue()


class _Trap:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))  # unpickling would create the file


def test_a_planted_npz_is_refused_never_unpickled(tmp_path):
    trap = tmp_path / "pwned"
    edges = _npy(np.arange(3.0))
    cases = {
        "pickle": {"counts.npy": _npy(np.array([_Trap(str(trap))] * 2), True), "edges.npy": edges},
        "bomb": {"counts.npy": _npy(np.zeros(1 << 20, dtype=np.int64)), "edges.npy": edges},
        "extra": {"counts.npy": _npy(np.ones(2)), "edges.npy": edges, "x.npy": b""},
        "2d": {"counts.npy": _npy(np.ones((2, 1))), "edges.npy": edges},
        "fit": {"counts.npy": _npy(np.ones(5)), "edges.npy": edges},
        "nan": {"counts.npy": _npy(np.array([1.0, np.nan])), "edges.npy": edges},
        "down": {"counts.npy": _npy(np.ones(2)), "edges.npy": _npy(np.array([3.0, 1, 0]))},
        "text": {"counts.npy": b"not an array", "edges.npy": edges},
        "strings": {"counts.npy": _npy(np.array(["a", "b"])), "edges.npy": edges},
    }
    expect = {
        "pickle": "allow_pickle",
        "bomb": "at most|inflates",
        "extra": "counts.npy and edges.npy only",
        "2d": "shape",
        "fit": "5 counts and 3 edges",
        "nan": "NaN",
        "down": "decrease",
        "text": "magic string",
        "strings": "1-D int or float",
    }
    run_dir = tmp_path / "run"
    for name, members in cases.items():
        ref = _plant(run_dir, _zip(members), "npz")
        with pytest.raises(ValueError, match=expect[name]) as info:
            load_histogram(run_dir, ref)
        assert ref["path"] in str(info.value)  # the message names the file
    assert not trap.exists()
    with pytest.raises(ValueError, match="not a histogram .npz"):
        decode_histogram(b"PK\x03\x04 truncated")
    # a table's reference is not a histogram, whatever its file holds
    with pytest.raises(ValueError, match="not a histogram"):
        load_histogram(run_dir, _plant(run_dir, b"x", "parquet"))


def test_a_planted_npz_of_many_entries_is_refused_before_its_directory_is_parsed(tmp_path):
    from expr_tracker.media import npz

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
        for i in range(3000):  # 3,000 directory entries: ~260 KB; 256 MiB held 3 million
            zf.writestr(str(i), b"")
    assert len(buf.getvalue()) > npz.MAX_FILE_BYTES
    ref = _plant(tmp_path / "run", buf.getvalue(), "npz")
    with pytest.raises(ValueError, match=f"at most {npz.MAX_FILE_BYTES}"):
        load_histogram(tmp_path / "run", ref)
    h = et.Histogram(np.arange(10**6), num_bins=npz.MAX_BINS)  # the largest kept: it reads
    assert len(encode_histogram(h.counts, h.edges)) <= npz.MAX_FILE_BYTES


def test_an_npz_linked_from_outside_the_media_folder_is_refused(tmp_path):
    data = encode_histogram(np.ones(2, dtype=np.int64), np.arange(3.0))
    sha = hashlib.sha256(data).hexdigest()
    (tmp_path / "elsewhere.npz").write_bytes(data)
    run_dir = tmp_path / "run"
    (run_dir / "media").mkdir(parents=True)
    (run_dir / "media" / f"{sha}.npz").symlink_to(tmp_path / "elsewhere.npz")
    with pytest.raises(OSError, match="link|outside"):
        load_histogram(run_dir, {"_type": "histogram", "path": f"media/{sha}.npz"})


def _parquet(table) -> bytes:
    buf = io.BytesIO()
    pa.parquet.write_table(table, buf)
    return buf.getvalue()


def test_a_planted_parquet_is_read_bounded(tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    nested = _plant(run_dir, _parquet(pa.table({"x": [[1, 2], [3]]})), "parquet")
    with pytest.raises(ValueError, match="type list<.*not written here"):
        load_table(run_dir, nested)
    rows = pa.table({"s": ["y" * 1000] * 2000})  # dictionary-encoded: a small file
    data = _parquet(rows)
    assert len(data) < 20_000
    ref = _plant(run_dir, data, "parquet")
    monkeypatch.setattr(parquet, "MAX_TABLE_BYTES", 1_000_000)
    with pytest.raises(ValueError, match="expands past 1000000 bytes"):
        load_table(run_dir, ref)
    monkeypatch.setattr(parquet, "MAX_ROWS", 100)
    with pytest.raises(ValueError, match="2000 rows x 1 columns; at most 100 rows"):
        load_table(run_dir, ref, output_type="dict")
    with pytest.raises(ValueError, match="not a Parquet table"):
        load_table(run_dir, _plant(run_dir, b"PAR1 nothing PAR1", "parquet"))
    bad_meta = pa.table({"a": ["1"]}).replace_schema_metadata({parquet.JSON_COLUMNS_KEY: b"{"})
    with pytest.raises(ValueError, match="JSON column list"):
        load_table(run_dir, _plant(run_dir, _parquet(bad_meta), "parquet"))


def test_a_planted_parquet_of_run_length_zeros_is_refused_before_reading(tmp_path, monkeypatch):
    # 200k int64 zeros: 1.6 MB once read, a few hundred bytes of pages (the footer's size)
    data = _parquet(pa.table({"z": np.zeros(200_000, dtype=np.int64)}))
    assert len(data) < 10_000
    ref = _plant(tmp_path / "run", data, "parquet")
    monkeypatch.setattr(parquet, "MAX_TABLE_BYTES", 1_000_000)
    with pytest.raises(ValueError, match="1600000 bytes uncompressed; at most 1000000"):
        load_table(tmp_path / "run", ref)


# -- runs written before the files -----------------------------------------------------------


def legacy_run(root: Path) -> tuple[Path, dict]:
    """A run as earlier versions wrote it: the histogram's counts in the row, the table in
    ``media/<sha256>.table.json`` with an image cell."""
    run = et.init(project="p", name="old", dir=str(root), system=False)
    et.log({"loss": 1.0})
    run_dir = Path(run.dir)
    et.finish()
    img = et.Image(np.full((3, 2), 9, dtype=np.uint8))
    img_ref = {**_plant(run_dir, img.data, "png"), "_type": "image", "width": 2, "height": 3}
    table = {"columns": ["k", "im", "h"], "data": [[1, img_ref, None], [2, None, 0.5]]}
    body = json.dumps(table, separators=(",", ":")).encode()
    t_ref = {**_plant(run_dir, body, "table.json"), "_type": "table", "nrows": 2, "ncols": 3}
    hist = {"_type": "histogram", "values": [1, 2, 1], "bins": [0.0, 1.0, 2.0, 3.0]}
    row = {"_step": 1, "_time": 2.0, "h": hist, "t": t_ref}
    with open(run_dir / "metrics.jsonl", "a") as f:
        f.write(json.dumps(row) + "\n")
    return run_dir, row


def test_an_older_run_still_reads(tmp_path):
    run_dir, row = legacy_run(tmp_path / "runs")
    back = et.read_history(run_dir)[-1]
    counts, edges = load_histogram(run_dir, back["h"])
    assert counts.tolist() == [1, 2, 1] and edges.tolist() == [0.0, 1.0, 2.0, 3.0]
    assert media_label(back["h"]) == "<histogram 3 bins>"
    df = load_table(run_dir, back["t"])
    assert list(df.columns) == ["k", "im", "h"] and df["im"][0]["_type"] == "image"
    with pytest.raises(ValueError, match="not valid"):
        load_histogram(run_dir, {"_type": "histogram", "values": [1], "bins": [0.0]})


def test_export_copies_an_older_runs_table_and_its_image(tmp_path):
    pytest.importorskip("duckdb")
    from expr_tracker.query.export import export_runs

    run_dir, _ = legacy_run(tmp_path / "runs")
    res = export_runs(run_dir, tmp_path / "out" / "x.jsonl")
    assert res["media"] == {**res["media"], "files": 2, "refused": 0}  # table + its image


def test_mirrors_take_old_and_new_references(tmp_path):
    wandb = pytest.importorskip("wandb")
    from expr_tracker.backends.mediaconv import MediaConverter

    run_dir, row = legacy_run(tmp_path / "runs")
    warnings: list[str] = []
    conv = MediaConverter(wandb, run_dir, warnings.append, "wandb")
    out = conv.row({"h": row["h"], "t": row["t"]})
    assert isinstance(out["h"], wandb.Histogram) and out["h"].histogram == [1, 2, 1]
    assert isinstance(out["t"], wandb.Table) and isinstance(out["t"].data[0][1], wandb.Image)
    new = et.Histogram(np_histogram=([3, 4], [0.0, 1.0, 2.0]))
    out = conv.row({"h": {**new.to_ref(None), "path": _plant(run_dir, new.data, "npz")["path"]}})
    assert out["h"].histogram == [3, 4] and warnings == []


def test_rules_ignore_histogram_and_table_references(tmp_path):
    from expr_tracker.testing import capture_alerts

    rules = ["h > 0 => warn: a histogram is not a number", "loss > 1 => warn: high"]
    with capture_alerts() as cap:
        et.init(
            project="p", name="rules", dir=str(tmp_path / "runs"), system=False, alert_rules=rules
        )
        for i in range(3):
            et.log({"loss": 2.0, "h": et.Histogram([1, 2, i]), "t": et.Table(data=[[i]])})
        stats = et.info()["alerts"]["rules"]
        et.finish()
    assert cap.titles and all(t.startswith("loss > 1") for t in cap.titles)
    h_rule = next(v for k, v in stats.items() if k.startswith("h > 0"))
    assert (h_rule["fires"], h_rule["errors"], h_rule["disabled"]) == (0, 0, False)
