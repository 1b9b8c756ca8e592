"""Value and config encoding (issue: 'Values' and 'config' of the write path)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import json
import logging
import math
from pathlib import Path

import numpy as np
import pydantic
import pytest

import expr_tracker as et
from expr_tracker._warn import Warner
from expr_tracker.assemble import normalize_config
from expr_tracker.history.codec import decode_line, encode_row, normalize_value


class Color(enum.Enum):
    RED = "red"


@dataclasses.dataclass
class Opt:
    lr: float
    betas: tuple


class Model(pydantic.BaseModel):
    depth: int = 3


class Opaque:
    def __repr__(self):
        return "<opaque>"


def test_scalars_pass_through():
    for v in (1, 1.5, "s", True, None):
        assert normalize_value(v) is v


def test_numpy_values():
    assert normalize_value(np.float32(1.5)) == 1.5
    assert type(normalize_value(np.int64(3))) is int
    assert normalize_value(np.bool_(True)) is True
    assert normalize_value(np.arange(3)) == [0, 1, 2]
    assert normalize_value(np.zeros((2, 2))) == [[0.0, 0.0], [0.0, 0.0]]


def test_torch_values():
    torch = pytest.importorskip("torch")
    assert normalize_value(torch.tensor(2.5)) == 2.5
    assert normalize_value(torch.tensor([1, 2])) == [1, 2]
    assert normalize_value(torch.tensor(1.0, requires_grad=True) * 2) == 2.0
    assert normalize_value(torch.float32) == "torch.float32"


def test_other_types():
    when = dt.datetime(2026, 11, 30, 7, 0, 0)
    assert normalize_value(when) == "2026-11-30T07:00:00"
    assert normalize_value(Path("/a/b")) == "/a/b"
    assert normalize_value(Color.RED) == "red"
    assert normalize_value(Model()) == {"depth": 3}
    assert normalize_value(Opt(0.1, (0.9, 0.99))) == {"lr": 0.1, "betas": [0.9, 0.99]}
    assert normalize_value({1, 3, 2}) == [1, 2, 3]
    assert normalize_value({"a": (1, {"b": np.float64(2)})}) == {"a": [1, {"b": 2.0}]}


def test_unknown_type_repr_with_one_warning(caplog):
    w = Warner()
    with caplog.at_level(logging.WARNING, logger="expr_tracker"):
        assert normalize_value(Opaque(), w) == "<opaque>"
        assert normalize_value(Opaque(), w) == "<opaque>"
    assert sum("cannot encode" in r.message for r in caplog.records) == 1
    assert w.counts["repr: Opaque"] == 2


def test_encode_row_nonfinite_and_big_ints():
    assert encode_row({"a": 1.5}) == b'{"a":1.5}'
    assert encode_row({"a": float("nan")}) == b'{"a":NaN}'
    assert encode_row({"a": [1.0, float("-inf")]}) == b'{"a":[1.0,-Infinity]}'
    big = 1 << 70
    assert decode_line(encode_row({"a": big}))["a"] == big
    assert math.isnan(decode_line(b'{"a":NaN}')["a"])


def test_logged_values_round_trip(tmp_path):
    run = et.init(project="p", name="r", dir=str(tmp_path))
    et.log(
        {
            "np": np.float32(0.5),
            "arr": np.arange(2),
            "when": dt.date(2026, 1, 2),
            "path": Path("x"),
            "color": Color.RED,
            "opaque": Opaque(),
        }
    )
    et.finish()
    row = json.loads((run.dir / "metrics.jsonl").read_text())
    # an array logged bare is a histogram, as in wandb (docs/media.md "Arrays")
    assert row["arr"]["_type"] == "histogram" and row["arr"]["count"] == 2
    assert row["np"] == 0.5 and row["when"] == "2026-01-02"
    assert row["path"] == "x" and row["color"] == "red" and row["opaque"] == "<opaque>"


def test_config_accepts_omegaconf_sets_dtypes_and_nested(tmp_path):
    from omegaconf import OmegaConf

    torch = pytest.importorskip("torch")
    cfg = OmegaConf.create({"model": {"width": 64, "depth": "${model.width}"}, "tags": ["a"]})
    run = et.init(
        project="p",
        name="r",
        dir=str(tmp_path),
        config={"cfg": cfg, "ids": {3, 1}, "dtype": torch.float16, "opt": Opt(0.1, (1, 2))},
    )
    et.finish()
    saved = json.loads((run.dir / "config.json").read_text())
    assert saved["cfg"] == {"model": {"width": 64, "depth": 64}, "tags": ["a"]}
    assert saved["ids"] == [1, 3]
    assert saved["dtype"] == "torch.float16"
    assert saved["opt"] == {"lr": 0.1, "betas": [1, 2]}


def test_config_unresolvable_interpolation_stays_literal_with_warning():
    from omegaconf import OmegaConf

    cfg = OmegaConf.create({"ok": 1, "bad": "${missing.key}", "sub": {"x": "${ok}"}})
    with pytest.warns(UserWarning, match=r"^config\.bad: interpolation"):
        out = normalize_config(cfg)
    assert out == {"ok": 1, "bad": "${missing.key}", "sub": {"x": 1}}
    nested = OmegaConf.create({"c": "${nope}"})
    with pytest.warns(UserWarning, match=r"^config\.oc\.c: interpolation"):
        assert normalize_config({"oc": nested}) == {"oc": {"c": "${nope}"}}


def test_numpy_dtypes_and_classes_in_config():
    assert normalize_config({"d": np.dtype("float32"), "t": np.float32}) == {
        "d": "float32",
        "t": "numpy.float32",
    }
