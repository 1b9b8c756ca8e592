"""Names that could escape the store, hide in it or collide with it are refused, with an
error naming the field, the value and what is valid."""

from __future__ import annotations

import os

import pytest

import expr_tracker as et
from expr_tracker.artifacts import ArtifactNameError
from expr_tracker.artifacts.names import (
    parse_ref,
    validate_alias,
    validate_aliases,
    validate_entry_name,
    validate_name,
)

BAD_NAMES = [
    "",
    "..",
    ".",
    ".hidden",
    "a/b",
    "/abs",
    "a\\b",
    "a\0b",
    "x" * 129,
    "a b",
    "a:b",
    "index.jsonl",
    3,
    None,
]


@pytest.mark.parametrize("value", BAD_NAMES)
def test_bad_artifact_names_are_refused(value):
    with pytest.raises(ArtifactNameError) as err:
        validate_name(value)
    msg = str(err.value)
    assert msg.startswith("artifact name ") and repr(value) in msg and "valid:" in msg


@pytest.mark.parametrize("value", ["digits", "model-v2", "a.b_c", "_x", "9", "x" * 128])
def test_good_artifact_names(value):
    assert validate_name(value) == value


def test_artifact_constructor_names_the_field():
    with pytest.raises(ArtifactNameError, match=r"artifact name '\.\./up'"):
        et.Artifact("../up")
    with pytest.raises(ArtifactNameError, match=r"artifact type 'a/b'"):
        et.Artifact("ok", type="a/b")


BAD_ENTRIES = [
    "",
    "/etc/passwd",
    "../x",
    "a/../../x",
    "a//b",
    "./a",
    "a/.",
    "a\\b",
    "a\nb",
    "a\0b",
    "x" * 1025,
    "a/" + "y" * 256,
    "a/",
]


@pytest.mark.parametrize("value", BAD_ENTRIES)
def test_bad_file_names_inside_an_artifact(value, tmp_path):
    with pytest.raises(ArtifactNameError) as err:
        validate_entry_name(value)
    assert repr(value) in str(err.value) and "valid:" in str(err.value)
    src = tmp_path / "f"
    src.write_text("x")
    art = et.Artifact("a")
    with pytest.raises(ArtifactNameError):
        art.add_file(src, name=value)
    assert art.files == {}


@pytest.mark.parametrize("value", ["a", "data/train.csv", ".gitignore", "a/.b/c", "ü/名前.txt"])
def test_good_file_names(value):
    assert validate_entry_name(value) == value


def test_aliases():
    assert validate_aliases(["best", "latest", "best", "prod"]) == ["best", "prod"]
    assert validate_aliases("best") == ["best"]
    for bad in ("latest", "v3", "../x", ""):
        with pytest.raises(ArtifactNameError, match="alias"):
            validate_alias(bad)
    with pytest.raises(ArtifactNameError, match=r"aliases\[1\] 'v2'"):
        validate_aliases(["ok", "v2"])
    with pytest.raises(ArtifactNameError, match="a list of alias strings"):
        validate_aliases(3)


def test_parse_ref():
    assert parse_ref("ds") == ("ds", "latest")
    assert parse_ref("ds:latest") == ("ds", "latest")
    assert parse_ref("ds:v12") == ("ds", "v12")
    assert parse_ref("ds:best") == ("ds", "best")
    for bad in ("team/ds:v1", "ds:", "ds:a:b", ":v1", "../ds"):
        with pytest.raises(ArtifactNameError):
            parse_ref(bad)


def test_duplicate_and_conflicting_names_in_one_artifact(tmp_path):
    f = tmp_path / "f"
    f.write_text("x")
    art = et.Artifact("a")
    art.add_file(f, name="d/x")
    with pytest.raises(ArtifactNameError, match="already in artifact"):
        art.add_file(f, name="d/x")
    with pytest.raises(ArtifactNameError, match="is a directory"):
        art.add_file(f, name="d")
    with pytest.raises(ArtifactNameError, match="needs 'd/x' to be a directory"):
        art.add_reference("s3://b/k", name="d/x/y")
    (tmp_path / "tree" / "x").mkdir(parents=True)
    (tmp_path / "tree" / "x" / "y").write_text("y")
    (tmp_path / "tree" / "z").write_text("z")
    with pytest.raises(ArtifactNameError):  # d/x/y under the file d/x: nothing added
        art.add_dir(tmp_path / "tree", name="d")
    assert sorted(art.files) == ["d/x"]
    assert art.add_dir(tmp_path / "tree", name="e") is art  # chains
    assert sorted(art.files) == ["d/x", "e/x/y", "e/z"]


def test_reference_names(tmp_path):
    art = et.Artifact("a")
    assert art.add_reference("s3://bucket/dir/file.parquet?versionId=3") == "file.parquet"
    assert art.add_reference("https://host/x/", name="site") == "site"
    with pytest.raises(ArtifactNameError, match="pass name="):
        art.add_reference("s3://")
    with pytest.raises(ArtifactNameError, match="reference uri"):
        art.add_reference("")


@pytest.mark.parametrize("value", ["ok\n", "best\n"])
def test_a_trailing_newline_is_not_a_valid_word(value, tmp_path):
    # re's "$" also matches before a final "\n": "ok\n" became a store directory
    with pytest.raises(ArtifactNameError, match="name"):
        validate_name(value)
    with pytest.raises(ArtifactNameError, match="alias"):
        validate_alias(value)
    with pytest.raises(ArtifactNameError, match="type"):
        et.Artifact("ok", type=value)
    with pytest.raises(ArtifactNameError):
        parse_ref("ok:v1\n")


def test_strings_that_are_not_utf8_are_named_not_a_unicode_error(tmp_path):
    # a file named in Latin-1 (os.walk gives a lone surrogate) raised UnicodeEncodeError
    d = tmp_path / "d"
    d.mkdir()
    (d / "ok.txt").write_text("y")
    with pytest.raises(ArtifactNameError, match="not valid UTF-8"):
        validate_entry_name("caf\udce9.txt")
    with pytest.raises(ArtifactNameError, match="surrogates"):
        et.Artifact("x").add_reference("s3://b/caf\udce9")
    et.init(project="p", name="r", dir=str(tmp_path / "runs"))
    with pytest.raises(et.ExprTrackerError, match="not valid UTF-8"):
        et.log_artifact(d, metadata={"s": "caf\udce9"})
    assert et.log({"a": 1}) == 0  # et.log goes on
    assert et.log_artifact(d).version == 0  # and nothing was left half-done
    et.finish()
    raw = bytes(tmp_path / "raw")
    os.makedirs(raw)
    with open(raw + b"/caf\xe9.txt", "wb") as f:
        f.write(b"x")
    with pytest.raises(ArtifactNameError, match="not valid UTF-8"):
        et.Artifact("raw").add_dir(tmp_path / "raw")


def test_add_file_of_a_fifo_says_what_it_is(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(et.ExprTrackerError, match="not a regular file"):
        et.Artifact("x").add_file(fifo)  # it said "missing"
    with pytest.raises(et.ExprTrackerError, match="missing"):
        et.Artifact("x").add_file(tmp_path / "nope")
