"""The mirror fields of the run spec: backends, backend_kwargs, backend_on_rank,
backend_queue_size, backend_finish_timeout (spec/mirroring.py)."""

from __future__ import annotations

import pytest

from expr_tracker.spec import SpecError, resolve


def test_valid_forms():
    s = resolve(
        {
            "backends": "wandb",
            "backend_kwargs": {"wandb": {"entity": "team"}, "trackio": None},
            "backend_on_rank": [0, 3],
            "backend_finish_timeout": "500ms",
        },
        environ={},
    ).spec
    assert s.backends == ["wandb"]
    assert s.backend_kwargs == {"wandb": {"entity": "team"}, "trackio": {}}
    assert s.backend_on_rank == [0, 3] and s.backend_finish_timeout == 0.5
    s = resolve(
        kwargs={
            "backends": ["jsonl", {"type": "trackio", "space_id": None}],
            "backend_on_rank": "all",
        },
        environ={},
    ).spec
    assert s.backends == ["jsonl", {"type": "trackio", "space_id": None}]
    assert (s.backend_on_rank, s.backend_queue_size) == ("all", 10_000)


@pytest.mark.parametrize(
    ("spec", "path", "words"),
    [
        ({"backends": ["neptune"]}, "backends[0]", ["'neptune'", "jsonl, trackio, wandb"]),
        ({"backends": [{"type": "mlflow"}]}, "backends[0]", ["'mlflow'", "jsonl, trackio, wandb"]),
        ({"backends": [{"type": "trackio", "entity": "x"}]}, "backends[0]", ["entity", "space_id"]),
        ({"backend_kwargs": {"wandb": {"proj": "x"}}}, "backend_kwargs", ["proj", "project"]),
        ({"backend_kwargs": {"wandb": "team"}}, "backend_kwargs", ["mapping", "str"]),
        ({"backend_kwargs": {"comet": {}}}, "backend_kwargs", ["'comet'", "wandb"]),
        ({"backend_on_rank": [0, -1]}, "backend_on_rank", ["list of ranks", "'all'"]),
        ({"backend_queue_size": 0}, "backend_queue_size", [">= 1"]),
        ({"backend_finish_timeout": -1}, "backend_finish_timeout", ["0"]),
    ],
)
def test_errors_name_the_field_the_value_and_what_is_valid(spec, path, words):
    with pytest.raises(SpecError) as err:
        resolve(spec, environ={})
    (issue,) = err.value.issues
    assert issue.path == path
    for word in words:
        assert word in str(err.value), (word, str(err.value))
