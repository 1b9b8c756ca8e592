"""spec.quick, the check of a plain spec without Pydantic (docs/architecture.md "Cold
start"): it agrees with the models on every value it accepts, leaves every value it does
not vouch for (a bad one included) to Pydantic, and its view reads as the model."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

import expr_tracker as et
from expr_tracker.spec import SpecError, resolve
from expr_tracker.spec.merge import nest_path
from expr_tracker.spec.models import RunSpec
from expr_tracker.spec.quick import DEFAULTS, LEAVES, SECTIONS, SpecView, quick_check
from expr_tracker.spec.sources import RUN_FIELDS


def strict(value: Any) -> Any:
    """``value`` with the type of every leaf, so that ``1 == 1.0 == True`` do not pass."""
    if isinstance(value, dict):
        return {(type(k).__name__, k): strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, [strict(v) for v in value])
    if isinstance(value, float) and math.isnan(value):
        return ("float", "nan")
    return (type(value).__name__, value)


def pydantic_dump(merged: dict) -> dict | None:
    try:
        return RunSpec.model_validate(merged).model_dump()
    except ValidationError:
        return None


def agree(merged: dict) -> dict | None:
    """The property: what the quick check accepts, the models accept and normalise the
    same way; what the models reject, the quick check leaves to them."""
    quick = quick_check(merged)
    slow = pydantic_dump(merged)
    if slow is None:
        assert quick is None, merged
    if quick is not None:
        assert strict(quick) == strict(slow), merged
    return quick


# --- the tables stay the models' ------------------------------------------------------------


def test_defaults_sections_and_fields_are_the_models():
    assert strict(DEFAULTS) == strict(RunSpec().model_dump())
    assert tuple(RunSpec.model_fields) == RUN_FIELDS

    def sections(model: type[BaseModel], prefix: str) -> set[str]:
        out = set()
        for name, info in model.model_fields.items():
            ann = info.annotation
            if isinstance(ann, type) and issubclass(ann, BaseModel):
                out.add(prefix + name)
                out |= sections(ann, prefix + name + ".")
        return out

    assert sections(RunSpec, "") == SECTIONS
    for path in LEAVES:  # every leaf the table checks is a leaf of the spec
        node: Any = DEFAULTS
        for part in path.split("."):
            node = node[part]
        assert path not in SECTIONS


@dataclasses.dataclass
class HParams:
    lr: float = 0.1
    layers: list = dataclasses.field(default_factory=lambda: [64, 64])


#: per leaf, values around what its field accepts: the right ones, their neighbours in
#: type (bool for int, 1.0 for 1, a str subclass, tuples for lists) and out of range
CANDIDATES: dict[str, list[Any]] = {
    "project": ["p", "", " p", ".", "..", "a/b", "é" * 101, "x" * 200, "x" * 201, 3, None],
    "name": ["r1", None, "", "a\\b", "r\x00", 1.5, ["r"]],
    "dir": ["./runs", "/tmp/x", Path("/tmp/x"), PurePosixPath("rel"), 3, None, b"/tmp"],
    "run_dir": [None, "/tmp/r", Path("r"), 0],
    "group": [None, "g", 1, ["g"]],
    "tags": [[], ["a", "b"], ("a",), ["a", 1], "a", None, {"a"}],
    "notes": [None, "n", 2],
    "entity": [None, "team", True],
    "job_type": [None, "train", 1.0],
    "mode": ["offline", "online", "disabled", "Offline", "other", None, 1],
    "stream": [None, "data0", "rank0", "Rank3", "a.b", "x" * 64, "x" * 65, "", 5],
    "resume": ["allow", "never", "must", True, "auto", None],
    "config": [
        {},
        None,
        {"lr": 0.1, "n": 3, "ok": True, "s": "x", "none": None},
        {"nested": {"a": [1, 2.5, {"b": None}], 3: "int key below the top"}},
        {3: "int key at the top"},
        {"t": (1, 2)},
        {"s": {1, 2}},
        {"p": Path("x")},
        {"f": float("nan"), "g": float("inf")},
        {"b": b"bytes"},
        HParams(),
        [("a", 1)],
        "lr=0.1",
    ],
    "history.step_policy": ["monotonic", "allow", "Allow", None],
    "history.rank_aware": [True, False, 1, 0, "true", None],
    "history.alert_window": [1, 4096, 0, -1, 1.0, True, "8", None],
    "history.query_cache": [True, False, 1, 0, "true", "no", None],
    "history.cache.rows": [0, 5, -1, 2.0, False, True],
    "history.buffer.size": [1, 0, 10, 1.5, "10", True],
    "history.buffer.max_pending_records": [1, 0, 7, True, 2.0],
    "spans.enabled": [True, False, 1, "yes", None],
    "spans.metrics": [False, 0],
    "spans.count": [True, "false"],
    "spans.async_write": [False, 1.0],
    "spans.buffer.size": [3, 0, False, True],
    "spans.buffer.max_pending_records": [9, -3, True],
    "alerts.enabled": [False, True, 0],
    "alerts.rules": [
        [],
        ["loss > 1 => error: high", "isnan(loss)"],
        [""],
        "loss > 1",
        ("loss > 1",),
        {"high": "loss > 1 => error: high"},
        [{"condition": "loss > 1"}],
        [{"loss > 1": "high"}],  # YAML's reading of an unquoted one-line rule
        [1],
        None,
    ],
    "artifacts.mode": ["copy", "link", "move", None],
    "system.enabled": [False, True, "off", 1],
    "backends": [
        [],
        None,
        "wandb",
        ["jsonl", "trackio", "wandb"],
        ["Wandb"],
        ["mlflow"],
        [{"type": "wandb"}],
        ("wandb",),
        "",
        [None],
        3,
    ],
}


def test_every_leaf_of_the_table_has_candidates():
    assert set(CANDIDATES) == set(LEAVES)


@pytest.mark.parametrize("path", sorted(CANDIDATES))
def test_quick_and_pydantic_agree_on_each_leaf(path):
    accepted = 0
    for value in CANDIDATES[path]:
        if agree(nest_path(path, value)) is not None:
            accepted += 1
    assert accepted, f"{path}: the quick check accepts none of its values"


def test_unknown_keys_sections_given_whole_and_other_shapes_go_to_pydantic():
    for merged in (
        {"projet": "p"},  # a typo: Pydantic names it, with the close match
        {"history": {"buffer": {"sise": 3}}},
        {"history": "big"},
        {"history": {"cache": {"bytes": "1GiB"}}},  # a unit: the models parse it
        {"spans": {"plugins": ["cpu_time"]}},
        {"alerts": {"rules": {"high": "loss > 1 => error: high"}}},  # named: parsed
        {"alerts": {"channels": [{"type": "console"}]}},
        {"backends": [{"type": "wandb", "entity": "team"}]},
        {"system": {"interval": 5}},
        {"sync": {"url": "file:///tmp/x"}},
        {1: "p"},
    ):
        assert quick_check(merged) is None, merged
        agree(merged)


plain_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=True),
    st.text(max_size=8),
)
any_leaf = st.one_of(
    plain_leaf,
    st.binary(max_size=4),
    st.tuples(st.integers()),
    st.frozensets(st.integers(), max_size=2),
)
values = st.recursive(
    any_leaf,
    lambda children: st.one_of(
        st.lists(children, max_size=3),
        st.dictionaries(st.one_of(st.text(max_size=5), st.integers()), children, max_size=3),
    ),
    max_leaves=12,
)


@settings(max_examples=100, deadline=None)
@given(
    config=st.one_of(st.dictionaries(st.text(max_size=6), values, max_size=4), values),
    project=st.one_of(st.text(max_size=6), st.integers(), st.none()),
    stream=st.one_of(st.none(), st.from_regex(r"[A-Za-z0-9_.\-]{0,6}", fullmatch=True)),
    tags=st.one_of(st.lists(st.text(max_size=3), max_size=3), values),
    size=st.one_of(st.integers(-2, 3), st.floats(0, 3), st.booleans()),
)
def test_quick_and_pydantic_agree_on_generated_specs(config, project, stream, tags, size):
    merged: dict[str, Any] = {"config": config, "tags": tags, "stream": stream}
    if project is not None:
        merged["project"] = project
    merged["history"] = {"buffer": {"size": size}}
    agree(merged)


# --- resolve(quick=True): the same ResolvedSpec, the same errors ---------------------------


def test_resolve_quick_gives_the_same_spec_sources_and_saved_form():
    kwargs = {
        "project": "p",
        "name": "r",
        "dir": "/tmp/runs",
        "config": {"lr": 0.1, "net": {"depth": 3}, "token": "s3cret"},
        "tags": ["a"],
        "spans": False,
        "buffer_size": 7,
        "system": {"enabled": False},
    }
    slow = resolve(None, kwargs=kwargs, environ={})
    fast = resolve(None, kwargs=kwargs, environ={}, quick=True)
    assert isinstance(fast.spec, SpecView) and isinstance(slow.spec, RunSpec)
    assert strict(fast.spec.model_dump()) == strict(slow.spec.model_dump())
    assert fast.sources == slow.sources
    assert fast.redacted() == slow.redacted()  # spec.json: the token hidden alike
    assert fast.redacted()["config"]["token"] == "***"
    assert fast.spec.materialize() == slow.spec


def test_resolve_quick_with_a_spec_dict_fills_the_name_as_the_models_do():
    fast = resolve({"project": "p", "history": {"rank_aware": False}}, environ={}, quick=True)
    assert isinstance(fast.spec, SpecView)
    assert fast.spec.name and fast.source_of("name") == "default"
    assert fast.source_of("history.rank_aware") == "spec"
    assert fast.spec.history.rank_aware is False


@pytest.mark.parametrize(
    "kwargs",
    [
        {"project": "a/b"},
        {"stream": "rank0"},
        {"mode": "offfline"},
        {"buffer_size": 0},
        {"tags": "a"},
        {"config": {1: "x"}},
        {"projet": "p"},
    ],
)
def test_a_bad_value_gets_the_pydantic_error_word_for_word(kwargs):
    with pytest.raises(SpecError) as slow:
        resolve(None, kwargs=kwargs, environ={})
    with pytest.raises(SpecError) as fast:
        resolve(None, kwargs=kwargs, environ={}, quick=True)
    assert str(fast.value) == str(slow.value)
    assert [i.path for i in fast.value.issues] == [i.path for i in slow.value.issues]


def test_environment_sources_still_count_on_the_quick_path(tmp_path):
    spec_file = tmp_path / "run.yaml"
    spec_file.write_text("project: from-file\n")
    environ = {"ET_CONFIG": str(spec_file)}
    fast = resolve(None, kwargs={"dir": str(tmp_path)}, environ=environ, quick=True)
    slow = resolve(None, kwargs={"dir": str(tmp_path)}, environ=environ)
    assert isinstance(fast.spec, SpecView) and fast.spec.project == "from-file"
    assert fast.sources == slow.sources and fast.locations == slow.locations
    hooked = resolve(None, environ={"ET_SLACK_WEBHOOK_URL": "https://hooks.example/x"}, quick=True)
    assert isinstance(hooked.spec, RunSpec)  # a channel: the models build it
    assert [c.type for c in hooked.spec.alerts.channels] == ["slack"]


# --- the view reads as the model -----------------------------------------------------------


def test_the_view_reads_copies_and_refuses_writes_as_the_model():
    merged = {"project": "p", "history": {"buffer": {"size": 3}}, "tags": ["x"]}
    view = SpecView(quick_check(merged), merged)
    model = RunSpec.model_validate(merged)
    assert view.history.buffer.size == model.history.buffer.size == 3
    assert view.alerts.policy.timeout == model.alerts.policy.timeout
    assert view.model_fields_set == model.model_fields_set
    assert view.history.model_fields_set == model.history.model_fields_set
    assert view.history.buffer.model_fields_set == {"size"}
    assert view.spans.model_fields_set == model.spans.model_fields_set == set()
    renamed = view.model_copy(update={"name": "n"})
    assert renamed.name == "n" and view.name is None
    assert renamed.model_fields_set == model.model_copy(update={"name": "n"}).model_fields_set
    assert renamed.materialize() == model.model_copy(update={"name": "n"})
    dumped = view.model_dump()
    dumped["tags"].append("y")
    assert view.tags == ["x"]  # a copy, as model_dump gives
    assert view.model_dump(mode="json") == model.model_dump(mode="json")  # options: the model
    assert view.model_json_schema() == model.model_json_schema()  # anything else: the model
    assert repr(view) == repr(model)
    with pytest.raises(AttributeError, match="frozen"):
        view.project = "q"  # type: ignore[misc]


def test_run_spec_is_the_model_on_first_access(tmp_path):
    run = et.init(dir=str(tmp_path), project="p", name="r", config={"lr": 0.1})
    try:
        assert isinstance(run.resolved.spec, SpecView)
        assert isinstance(run.spec, RunSpec) and run.spec.config == {"lr": 0.1}
        assert run.spec is run.spec
        assert run.group is None and run.job_type is None
    finally:
        et.finish()
