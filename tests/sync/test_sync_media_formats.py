"""`et sync` carries a run's histogram (.npz) and table (Parquet) files, and a teammate's
mirror reads them back with the same readers (docs/media.md "Syncing")."""

from __future__ import annotations

import numpy as np
import pytest

import expr_tracker as et
from expr_tracker.media import load_histogram, load_table
from expr_tracker.sync.mirror import mirror
from expr_tracker.sync.upload import sync_dir

pd = pytest.importorskip("pandas")
pytest.importorskip("pyarrow")


def test_histograms_and_tables_sync_and_read_back(tmp_path):
    run = et.init(project="proj", name="r1", dir=str(tmp_path / "runs"), system=False)
    df = pd.DataFrame({"k": np.arange(3, dtype=np.int16), "s": ["a", "b", "c"]})
    et.log({"h": et.Histogram([1, 2, 2, 3], num_bins=3), "t": et.Table(dataframe=df)})
    row = et.history()[0]
    et.finish()
    url = f"file://{tmp_path / 'bucket'}"
    assert sync_dir(tmp_path / "runs", url).errors == []
    got = mirror(url, cache_dir=tmp_path / "copy")
    assert got.problems == []
    copy = got.path / "proj" / "r1"
    assert (copy / row["h"]["path"]).read_bytes() == (run.dir / row["h"]["path"]).read_bytes()
    assert load_histogram(copy, row["h"])[0].tolist() == [1, 2, 1]
    pd.testing.assert_frame_equal(load_table(copy, row["t"]), df)
