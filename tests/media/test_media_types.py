"""et.Image, et.Histogram, et.Table on their own: pixels through PNG and back, exact
counts, tables from rows and dataframes, and the errors bad input gets (docs/media.md)."""

from __future__ import annotations

import hashlib
import io
import os

import numpy as np
import pytest

import expr_tracker as et
from expr_tracker.media.png import decode_png, encode_png, png_size


class _Sink:
    def __init__(self):
        self.files = {}

    def put(self, data, ext):
        sha = hashlib.sha256(data).hexdigest()
        self.files[f"media/{sha}.{ext}"] = data
        return f"media/{sha}.{ext}", sha


@pytest.mark.parametrize("shape", [(5, 7), (5, 7, 1), (5, 7, 2), (5, 7, 3), (5, 7, 4)])
def test_png_round_trip_is_exact_and_deterministic(shape):
    rng = np.random.default_rng(0)
    a = rng.integers(0, 256, size=shape, dtype=np.uint8)
    data = encode_png(a)
    assert png_size(data) == (7, 5)
    back = decode_png(data)
    want = a if a.ndim == 3 else a[:, :, None]
    assert back.dtype == np.uint8 and np.array_equal(back, want)
    assert encode_png(a.copy()) == data  # the same pixels, the same bytes (and hash)


def test_png_is_read_by_pillow_and_pillow_pngs_are_read_here():
    PIL = pytest.importorskip("PIL.Image")
    a = np.random.default_rng(1).integers(0, 256, size=(9, 4, 3), dtype=np.uint8)
    assert np.array_equal(np.asarray(PIL.open(io.BytesIO(encode_png(a)))), a)
    buf = io.BytesIO()
    PIL.fromarray(a).save(buf, format="PNG", optimize=True)  # adaptive filters
    assert np.array_equal(decode_png(buf.getvalue()), a)


def test_image_from_float_chw_tensor_pil_and_path(tmp_path):
    torch = pytest.importorskip("torch")
    PIL = pytest.importorskip("PIL.Image")
    hwc = np.random.default_rng(2).integers(0, 256, size=(6, 8, 3), dtype=np.uint8)
    sink = _Sink()
    ref = et.Image(hwc, caption="x").to_ref(sink)
    assert ref["_type"] == "image" and (ref["width"], ref["height"]) == (8, 6)
    assert ref["caption"] == "x" and np.array_equal(decode_png(sink.files[ref["path"]]), hwc)
    # float in [0, 1] as CHW (torch's layout) gives the same pixels
    t = torch.from_numpy(hwc.transpose(2, 0, 1).astype(np.float32) / 255.0)
    assert et.Image(t).sha256 == ref["sha256"]
    assert et.Image(PIL.fromarray(hwc)).sha256 == ref["sha256"]
    p = tmp_path / "a.png"
    p.write_bytes(sink.files[ref["path"]])
    assert et.Image(str(p)).sha256 == ref["sha256"]
    grey = et.Image(np.array([[0.0, 1.0], [0.5, 0.25]]))
    assert decode_png(grey.data)[:, :, 0].tolist() == [[0, 255], [128, 64]]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (np.zeros((5, 6, 7)), r"shape \(5, 6, 7\) is not valid"),
        (np.zeros((2,)), r"shape \(2,\) is not valid"),
        (np.zeros((0, 3)), "no pixels"),
        (np.array([[np.nan]]), "NaN"),
        (np.array([["a"]]), "dtype <U1"),
    ],
)
def test_image_bad_input_names_the_problem(data, message):
    with pytest.raises(ValueError, match=message):
        et.Image(data)


def test_image_bad_mode_and_file(tmp_path):
    with pytest.raises(ValueError, match="mode='XYZ'"):
        et.Image(np.zeros((2, 2)), mode="XYZ")
    (tmp_path / "t.txt").write_text("hello")
    with pytest.raises(ValueError, match="not a PNG, JPEG or GIF"):
        et.Image(tmp_path / "t.txt")
    with pytest.raises(FileNotFoundError):
        et.Image(tmp_path / "missing.png")
    fifo = tmp_path / "fifo.png"
    os.mkfifo(fifo)  # never opened: a read would wait for a writer
    for odd in (fifo, tmp_path, "/dev/zero"):
        with pytest.raises(ValueError, match="not a regular file"):
            et.Image(odd)
    (tmp_path / "bad.gif").write_bytes(b"GIF89a then nothing an image has")
    pytest.importorskip("PIL")
    with pytest.raises(ValueError, match="damaged GIF"):
        et.Image(tmp_path / "bad.gif")


def test_histogram_counts_are_numpys_and_nonfinite_are_counted():
    vals = np.random.default_rng(3).normal(size=1000)
    h = et.Histogram(np.append(vals, [np.nan, np.inf]), num_bins=10)
    ref = h.to_ref(None)
    counts, edges = np.histogram(vals, bins=10)
    assert h.values == h.histogram == counts.tolist() and h.bins == edges.tolist()
    assert (ref["nonfinite"], ref["count"], ref["num_bins"]) == (2, 1000, 10)
    assert (ref["min"], ref["max"]) == (edges[0], edges[-1])
    h2 = et.Histogram(np_histogram=(counts, edges))
    assert h2.values == counts.tolist() and "nonfinite" not in h2.to_ref(None)
    assert h2.to_ref(None)["sha256"] == ref["sha256"]  # the same arrays, the same file
    assert et.Histogram([]).to_ref(None)["count"] == 0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "one of sequence= or np_histogram="),
        ({"sequence": [1], "num_bins": 0}, r"num_bins=0\) is not valid"),
        ({"sequence": [1], "num_bins": 513}, "1..512"),
        ({"np_histogram": ([1, 2], [0, 1])}, "2 counts need 3 edges"),
        ({"np_histogram": ([1], [1, 0])}, "increasing"),
    ],
)
def test_histogram_bad_input(kwargs, message):
    with pytest.raises(ValueError, match=message):
        et.Histogram(**kwargs)


def test_table_rows_dataframe_and_cells():
    pd = pytest.importorskip("pandas")
    df = pd.DataFrame({"a": [1, 2], "b": ["x", "y"], "c": [0.5, float("nan")]})
    t = et.Table(dataframe=df)
    assert t.columns == ["a", "b", "c"] and t.data[0] == [1, "x", 0.5]
    img = et.Image(np.zeros((2, 2), dtype=np.uint8))
    t2 = et.Table(columns=["i", "img"], data=[[np.int64(1), img]])
    t2.add_data(2, None)
    sink = _Sink()
    ref = t2.to_ref(sink)
    assert ref["nrows"] == 2 and ref["ncols"] == 2 and len(sink.files) == 2  # the table + image


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"columns": ["a"], "data": [[1, 2]]}, "row 0 has 2 cells; the table has 1 columns"),
        ({"columns": ["a", "a"], "data": []}, "names repeat"),
        ({"columns": [1], "data": []}, "1 is not a string"),
        ({"columns": ["a"], "data": [[object()]]}, "row 0 column 'a': a cell of type object"),
        ({"columns": ["a"], "data": "abc"}, "rows are sequences of cells"),
        ({"columns": ["a"], "data": [[1], "b"]}, "row 1 is a str"),
    ],
)
def test_table_bad_input(kwargs, message):
    with pytest.raises(ValueError, match=message):
        et.Table(**kwargs)


def test_histogram_of_values_spanning_float64_range_bins_them():
    # max - min overflows float64: numpy alone raises "Too many bins for data range"
    h = et.Histogram(np.array([1.7e308, -1.7e308, 0.0]), num_bins=4)
    assert h.values == [1, 0, 1, 1] or h.values == [1, 1, 0, 1]
    assert h.bins[0] == -1.7e308 and h.bins[-1] == 1.7e308
