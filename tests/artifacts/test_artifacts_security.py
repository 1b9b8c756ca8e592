"""A store from anyone (docs/artifacts.md "Security"): tampered manifests and index lines,
symbolic links planted in a version directory or in a download root, FIFOs, deep nesting and
lone surrogates are refused with ``ArtifactCorruptedError`` (or skipped and counted), and
nothing is read or written outside the version directory or the download root. Stored and
downloaded copies are never more readable than their source; sparse files stay sparse."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import tempfile
import threading
from pathlib import Path

import pytest

import expr_tracker as et
from expr_tracker.artifacts import ArtifactCorruptedError, ArtifactError, ArtifactStore
from expr_tracker.artifacts.store import version_digest

# ---------------------------------------------------------------------------- helpers


def _tree(root: Path, files: dict[str, bytes]) -> Path:
    for name, data in files.items():
        p = root / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    return root


def _art(name: str, src: Path, **kw) -> et.Artifact:
    a = et.Artifact(name, **kw)
    a.add_dir(src)
    return a


@pytest.fixture
def base(tmp_path):
    """A deep folder, so that names climbing out with ``..`` still land inside tmp_path,
    where the sentinel files are. ``<version dir>/../../../../sentinel.txt`` is the planted
    ``base/sentinel.txt``; ``<download root>/../../../../sentinel.txt`` is
    ``tmp_path/sentinel.txt``: a download that followed the name would overwrite it."""
    base = tmp_path / "a" / "b" / "c"
    base.mkdir(parents=True)
    _tree(tmp_path, {"sentinel.txt": b"keep me", "a/b/c/sentinel.txt": b"planted"})
    return base


@pytest.fixture
def store(base):
    s = ArtifactStore(base / "proj" / "artifacts", mode="copy")
    src = _tree(base / "src", {"a.txt": b"alpha", "d/b.txt": b"bravo"})
    s.log(_art("ds", src))
    return s


def _snapshot(top: Path, skip: tuple[Path, ...] = ()) -> dict[str, tuple[str, bytes | str]]:
    """Every entry under ``top`` (except below ``skip``): its kind and content."""
    out: dict[str, tuple[str, bytes | str]] = {}
    for dirpath, dirnames, filenames in os.walk(top):
        d = Path(dirpath)
        dirnames[:] = [n for n in dirnames if not any(d / n == s for s in skip)]
        for n in dirnames + filenames:
            p = d / n
            rel = str(p.relative_to(top))
            if p.is_symlink():
                out[rel] = ("link", os.readlink(p))
            elif p.is_file():
                out[rel] = ("file", p.read_bytes())
            elif p.is_dir():
                out[rel] = ("dir", "")
    return out


def _manifest_path(store: ArtifactStore, name: str = "ds", version: int = 0) -> Path:
    return store.root / name / f"v{version}.manifest.json"


def _forge(store: ArtifactStore, edit, *, consistent: bool = True, name="ds", version=0) -> None:
    """Rewrite a manifest with ``edit(manifest)``; ``consistent``: also recompute its digest
    and point the index line at it, as a careful forger would (so that only the check under
    test can catch it)."""
    path = _manifest_path(store, name, version)
    os.chmod(path, 0o644)
    m = json.loads(path.read_text())
    edit(m)
    if consistent:
        try:
            m["digest"] = version_digest(m["files"], m["references"])
        except (KeyError, TypeError):
            pass
        index = store.root / "index.jsonl"
        lines = [json.loads(x) for x in index.read_text().splitlines()]
        for rec in lines:
            if rec.get("name") == name and rec.get("version") == version:
                rec["digest"] = m.get("digest")
        index.write_text("".join(json.dumps(r) + "\n" for r in lines))
    path.write_text(json.dumps(m))


def _no_hang(fn, fifos=(), seconds: float = 20.0):
    """Run ``fn`` in a thread; fail (not hang) when it is still blocked after ``seconds``
    (a reader stuck opening a FIFO), releasing it by opening the FIFOs for writing."""
    result: dict = {}

    def target():
        try:
            result["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test's thread
            result["error"] = exc

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(seconds)
    hung = t.is_alive()
    if hung:
        for f in fifos:  # a writer arriving unblocks the reader's open
            try:
                os.close(os.open(f, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass
        t.join(5)
    assert not hung, f"{fn} blocked on a FIFO"
    if "error" in result:
        raise result["error"]
    return result.get("value")


# ------------------------------------------------------------- tampered manifests


def _set_file(i, **kw):
    def edit(m):
        m["files"][i].update(kw)

    return edit


TAMPERED = {
    "dotdot": _set_file(0, name="../../../../sentinel.txt"),
    "dotdot-inside": _set_file(0, name="d/../../../../../sentinel.txt"),
    "absolute": _set_file(0, name="/etc/passwd"),
    "control": _set_file(0, name="a\x1b]52;c;aGk=\x07.txt"),
    "backslash": _set_file(0, name="..\\..\\x"),
    "empty-name": _set_file(0, name=""),
    "name-not-str": _set_file(0, name=7),
    "sha-short": _set_file(0, sha256="abc"),
    "sha-upper": _set_file(0, sha256="A" * 64),
    "sha-not-hex": _set_file(0, sha256="g" * 64),
    "sha-int": _set_file(0, sha256=12),
    "sha-missing": lambda m: m["files"][0].pop("sha256"),
    "size-negative": _set_file(0, size=-1),
    "size-bool": _set_file(0, size=True),
    "mtime-str": _set_file(0, mtime_ns="now"),
    "duplicate": lambda m: m["files"].append(dict(m["files"][0])),
    "file-and-dir": lambda m: m["files"].append({**m["files"][1], "name": "a.txt/x"}),
    "files-not-list": lambda m: m.update(files={"a.txt": 1}),
    "entry-not-dict": lambda m: m["files"].append("a.txt"),
    "ref-dotdot": lambda m: m["references"].append({"name": "../r", "uri": "s3://b/k"}),
    "ref-uri-escape": lambda m: m["references"].append({"name": "r", "uri": "s3://\x1b[2J"}),
    "manifest-name": lambda m: m.update(name="other"),
    "manifest-version": lambda m: m.update(version=2),
    "metadata-list": lambda m: m.update(metadata=[1, 2]),
    "type-bad": lambda m: m.update(type="../x"),
}


@pytest.mark.parametrize("case", sorted(TAMPERED))
def test_a_tampered_manifest_is_refused_and_nothing_is_written(tmp_path, base, store, case):
    out = base / "out"
    _forge(store, TAMPERED[case])
    before = _snapshot(tmp_path, skip=(out,))
    with pytest.raises(ArtifactCorruptedError, match=r"ds:v0|ds"):
        v = store.get("ds")
        v.download(out)  # reached only when get() let it through (before the fix)
    assert _snapshot(tmp_path, skip=(out,)) == before
    assert not out.exists()  # nothing was written
    assert (tmp_path / "sentinel.txt").read_bytes() == b"keep me"


def test_the_error_names_the_entry(store):
    _forge(store, _set_file(0, name="../../../../sentinel.txt"))
    with pytest.raises(ArtifactCorruptedError, match=r"file entry 0 name '\.\./\.\./"):
        store.get("ds")
    _forge(store, _set_file(0, name="a.txt", sha256="abc"))
    with pytest.raises(ArtifactCorruptedError, match=r"file 'a.txt': sha256 'abc' is not 64 hex"):
        store.get("ds")


def test_a_manifest_edited_without_its_digest_is_refused(store):
    _forge(store, _set_file(0, size=4), consistent=False)
    with pytest.raises(ArtifactCorruptedError, match="not the digest of its entries"):
        store.get("ds")


def test_a_manifest_that_is_not_the_one_the_index_lists(base, store):
    src = _tree(base / "src2", {"z.txt": b"zulu"})
    store.log(_art("ds", src))
    # v1's manifest copied over v0's: valid on its own, but not what the index lists
    os.chmod(_manifest_path(store), 0o644)
    shutil.copy(_manifest_path(store, version=1), _manifest_path(store))
    with pytest.raises(ArtifactCorruptedError, match="not the one the index"):
        store.get("ds", "v0")


def test_a_forged_index_line_pointing_at_a_forged_version(tmp_path, base, store):
    """An index line and a manifest both forged (a version v9 whose file climbs out):
    refused when read, nothing written."""
    m = json.loads(_manifest_path(store).read_text())
    m["version"] = 9
    m["files"][0]["name"] = "../../../../sentinel.txt"
    m["digest"] = version_digest(m["files"], m["references"])
    _manifest_path(store, version=9).write_text(json.dumps(m))
    shutil.copytree(store.root / "ds" / "v0", store.root / "ds" / "v9")
    with open(store.root / "index.jsonl", "a") as f:
        line = {"kind": "version", "name": "ds", "version": 9, "digest": m["digest"]}
        f.write(json.dumps(line) + "\n")
    out = base / "out"
    before = _snapshot(tmp_path, skip=(out,))
    with pytest.raises(ArtifactCorruptedError, match=r"file entry 0 name '\.\./"):
        store.get("ds").download(out)
    assert _snapshot(tmp_path, skip=(out,)) == before and not out.exists()
    assert store.get("ds", "v0").verify()  # the real version still reads


def test_use_artifact_refuses_a_tampered_manifest(tmp_path):
    runs = tmp_path / "runs"
    src = _tree(tmp_path / "src", {"a.txt": b"alpha"})
    et.init(project="p", name="r", dir=str(runs))
    et.log_artifact(src, name="ds")
    store = et.get_run().artifacts.store
    _forge(store, _set_file(0, name="/etc/passwd"))
    with pytest.raises(ArtifactCorruptedError, match="absolute"):
        et.use_artifact("ds")


# ------------------------------------------------------ content checked when handed out


@pytest.mark.parametrize("with_mtime", [True, False])
def test_content_changed_is_caught_when_handed_out(base, store, with_mtime):
    if not with_mtime:  # a manifest without mtime_ns: no reason to skip the hash
        _forge(store, lambda m: [f.pop("mtime_ns") for f in m["files"]])
    v = store.get("ds")
    p = v.path / "a.txt"
    os.chmod(p, 0o644)
    p.write_bytes(b"ALPHA")  # same size, other content
    for hand_out in (v.check, lambda: v.get_path("a.txt"), lambda: v.download(base / "o")):
        with pytest.raises(ArtifactCorruptedError, match=r"a.txt \(content changed\)"):
            hand_out()
    assert not (base / "o").exists()
    with pytest.raises(ArtifactCorruptedError, match="content changed"):
        v.verify()


def test_get_path_checks_the_file_it_hands_out(store):
    v = store.get("ds")
    os.chmod(v.path / "d" / "b.txt", 0o644)
    (v.path / "d" / "b.txt").unlink()
    assert v.get_path("a.txt") == v.path / "a.txt"
    with pytest.raises(ArtifactCorruptedError, match=r"d/b.txt \(missing\)"):
        v.get_path("d/b.txt")


# ------------------------------------------------------------- symbolic links planted


def _same_content_link(v, name: str, target: Path) -> None:
    """Replace stored file ``name`` by a symbolic link to ``target`` holding the same
    bytes, with the same modification time: every cheap check passes but containment."""
    stored = v.path / name
    data = stored.read_bytes()
    target.write_bytes(data)
    mtime = stored.stat().st_mtime_ns
    os.chmod(stored, 0o644)
    stored.unlink()
    stored.symlink_to(target)
    os.utime(target, ns=(mtime, mtime))


def test_a_symlink_in_the_version_directory_is_never_followed(tmp_path, base, store):
    v = store.get("ds")
    outside = tmp_path / "secret.txt"
    _same_content_link(v, "a.txt", outside)
    for hand_out in (
        v.check,
        v.verify,
        lambda: v.get_path("a.txt"),
        lambda: v.download(base / "o"),
    ):
        with pytest.raises(ArtifactCorruptedError, match=r"a.txt \(outside"):
            hand_out()
    assert not (base / "o").exists()


def test_a_symlinked_sub_directory_or_version_directory_is_refused(tmp_path, base, store):
    v = store.get("ds")
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(v.path / "d", elsewhere / "d")
    shutil.rmtree(v.path / "d")
    (v.path / "d").symlink_to(elsewhere / "d")
    with pytest.raises(ArtifactCorruptedError, match=r"d/b.txt \(outside"):
        v.get_path("d/b.txt")
    # the whole version directory a link to a copy elsewhere
    shutil.copytree(v.path, elsewhere / "v0", symlinks=False)
    shutil.rmtree(v.path)
    v.path.symlink_to(elsewhere / "v0")
    with pytest.raises(ArtifactCorruptedError, match="symbolic link"):
        store.get("ds").check()
    with pytest.raises(ArtifactCorruptedError, match="symbolic link"):
        store.get("ds").get_path("a.txt")


def test_a_symlink_planted_in_the_download_root_is_not_written_through(tmp_path, base, store):
    v = store.get("ds")
    out = base / "out"
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "b.txt").write_bytes(b"theirs")
    out.mkdir()
    (out / "d").symlink_to(outside)  # d/b.txt would land in outside/
    before = _snapshot(tmp_path, skip=(out,))
    with pytest.raises(ArtifactError, match=r"out/d is a symbolic link.*nothing was written"):
        v.download(out)
    assert _snapshot(tmp_path, skip=(out,)) == before
    assert sorted(p.name for p in out.iterdir()) == ["d"]  # not even a.txt
    # a link where a file goes is replaced, its target untouched
    (out / "d").unlink()
    (out / "a.txt").symlink_to(tmp_path / "sentinel.txt")
    v.download(out)
    assert not (out / "a.txt").is_symlink() and (out / "a.txt").read_bytes() == b"alpha"
    assert (tmp_path / "sentinel.txt").read_bytes() == b"keep me"


# ------------------------------------------------------------------- hostile readers


def test_fifos_in_the_store_never_hang_a_reader(tmp_path, base, store):
    v = store.get("ds")
    fifo = v.path / "a.txt"
    os.chmod(fifo, 0o644)
    fifo.unlink()
    os.mkfifo(fifo)
    for hand_out in (v.verify, lambda: v.get_path("a.txt"), lambda: v.download(base / "o")):
        with pytest.raises(ArtifactCorruptedError, match=r"a.txt \(a FIFO"):
            _no_hang(hand_out, [fifo])
    # the manifest a FIFO
    mpath = _manifest_path(store)
    os.chmod(mpath, 0o644)
    mpath.unlink()
    os.mkfifo(mpath)
    with pytest.raises(ArtifactCorruptedError, match="FIFO"):
        _no_hang(lambda: store.get("ds"), [mpath])
    # the version directory a FIFO
    shutil.rmtree(v.path)
    os.mkfifo(v.path)
    with pytest.raises(ArtifactCorruptedError, match="is a FIFO"):
        _no_hang(lambda: v.check(), [v.path])
    # the index a FIFO
    index = store.root / "index.jsonl"
    index.unlink()
    os.mkfifo(index)
    with pytest.raises(ArtifactCorruptedError, match="index .* FIFO"):
        _no_hang(lambda: store.get("ds"), [index])


def test_an_index_line_nested_20000_deep_is_skipped_and_counted(store):
    with open(store.root / "index.jsonl", "a") as f:
        f.write("[" * 20_000 + "]" * 20_000 + "\n")
        f.write('{"kind": "version", "name": ' + "[" * 20_000 + "]" * 20_000 + "}\n")
        f.write('{"kind": "version", "name": "x\\ud800", "version": 1, "digest": "0"}\n')
        f.write('{"kind": "alias", "name": "ds", "version": 1, "alias": "\\udc80"}\n')
        f.write('{"kind": "version", "name": "../x", "version": 1, "digest": "' + "0" * 64)
        f.write('"}\n')
    assert store.names() == ["ds"] and store.skipped == 5
    assert store.get("ds").verify()


def test_a_run_warns_once_about_bad_index_lines(tmp_path, caplog):
    src = _tree(tmp_path / "src", {"a.txt": b"alpha"})
    run = et.init(project="p", name="r", dir=str(tmp_path / "runs"))
    et.log_artifact(src, name="ds")
    with open(run.artifacts.store.root / "index.jsonl", "a") as f:
        f.write("[" * 20_000 + "]" * 20_000 + "\n")
    for _ in range(3):
        assert et.use_artifact("ds").version == 0
    assert caplog.text.count("1 bad line(s) skipped") == 1
    assert et.info()["artifacts"]["index_lines_skipped"] == 1


def test_lone_surrogates_in_a_manifest_are_refused(store):
    path = _manifest_path(store)
    os.chmod(path, 0o644)
    text = path.read_text().replace('"a.txt"', '"a\\udc80.txt"')
    path.write_text(text)
    with pytest.raises(ArtifactCorruptedError, match="surrogate"):
        store.get("ds")


def test_a_huge_manifest_is_not_read_whole(store):
    path = _manifest_path(store)
    os.chmod(path, 0o644)
    with open(path, "r+b") as f:
        f.truncate((1 << 30) + 1)  # sparse: a GiB of nothing
    with pytest.raises(ArtifactCorruptedError, match="larger than"):
        store.get("ds")


# ---------------------------------------------------------------- privacy of copies


@pytest.fixture
def umask022():
    old = os.umask(0o022)
    yield
    os.umask(old)


@pytest.mark.parametrize("mode", ["copy", "link"])
def test_a_stored_copy_is_never_more_readable_than_its_source(tmp_path, umask022, mode):
    src = _tree(tmp_path / "src", {"keys/id": b"secret", "pub.txt": b"p", "grp.txt": b"g"})
    os.chmod(src / "keys" / "id", 0o600)
    os.chmod(src / "pub.txt", 0o644)
    os.chmod(src / "grp.txt", 0o640)
    s = ArtifactStore(tmp_path / "artifacts", mode=mode)
    v, _ = s.log(_art("ds", src))
    bits = {n: stat.S_IMODE(os.stat(v.path / n).st_mode) for n in v.files()}
    if mode == "copy":
        assert bits == {"keys/id": 0o400, "pub.txt": 0o444, "grp.txt": 0o440}
    else:  # the same inode: the source's own bits
        assert bits == {"keys/id": 0o600, "pub.txt": 0o644, "grp.txt": 0o640}
    assert stat.S_IMODE(os.stat(v.path / "keys").st_mode) == 0o700
    assert stat.S_IMODE(os.stat(v.path).st_mode) == 0o700  # it holds a private file
    out = tmp_path / "out"
    out.mkdir()
    v.download(out)
    down = {n: stat.S_IMODE(os.stat(out / n).st_mode) for n in v.files()}
    assert down == bits
    assert stat.S_IMODE(os.stat(out / "keys").st_mode) == 0o700
    v2, _ = s.log(_art("pub", _tree(tmp_path / "p2", {"x.txt": b"x"})))
    assert stat.S_IMODE(os.stat(v2.path).st_mode) == 0o755


def _as_nobody(*cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *cmd],
        capture_output=True,
        text=True,
        timeout=30,
    )


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a reader as uid 65534")
@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv (util-linux)")
def test_another_user_cannot_read_a_stored_or_downloaded_0600_file(umask022):
    # a folder other users can enter (pytest's own temporary folder is 0700)
    top = Path(tempfile.mkdtemp(prefix="et-priv-", dir="/tmp"))
    try:
        os.chmod(top, 0o755)
        src = _tree(top / "src", {"id_key": b"-----BEGIN KEY-----"})
        pub = _tree(top / "pubsrc", {"readme.txt": b"hello"})
        os.chmod(src / "id_key", 0o600)
        os.chmod(pub / "readme.txt", 0o644)
        s = ArtifactStore(top / "proj" / "artifacts", mode="copy")
        key, _ = s.log(_art("key", src))
        readme, _ = s.log(_art("readme", pub))
        dl = top / "dl"
        dl.mkdir()
        os.chmod(dl, 0o755)
        key.download(dl)
        for path in (key.get_path("id_key"), dl / "id_key"):
            assert stat.S_IMODE(os.stat(path).st_mode) == 0o400
            got = _as_nobody("cat", str(path))
            assert got.returncode != 0 and "Permission denied" in got.stderr, got
        # the control: the same reader can read a public file of the same store
        got = _as_nobody("cat", str(readme.get_path("readme.txt")))
        assert got.returncode == 0 and got.stdout == "hello", got
    finally:
        shutil.rmtree(top)


# ---------------------------------------------------------------------- sparse files


def _sparse(path: Path, size: int = 64 << 20) -> bytes:
    with open(path, "wb") as f:
        f.truncate(size)
        f.seek(1 << 20)
        f.write(b"data" * 1024)
        f.seek(size - 4096)
        f.write(b"tail" * 1024)
    return hashlib.sha256(path.read_bytes()).hexdigest().encode()


def test_a_sparse_file_stays_sparse_in_the_store_and_in_a_download(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    sha = _sparse(src / "big.bin")
    if os.stat(src / "big.bin").st_blocks * 512 > 8 << 20:
        pytest.skip("this file system does not keep holes")
    s = ArtifactStore(tmp_path / "artifacts", mode="copy")
    v, _ = s.log(_art("ds", src))
    stored = os.stat(v.get_path("big.bin"))
    assert stored.st_size == 64 << 20
    assert stored.st_blocks * 512 < 1 << 20  # 8 KiB of data, not 64 MiB
    assert v.manifest["files"][0]["sha256"].encode() == sha
    assert v.verify()
    out = tmp_path / "out"
    v.download(out)  # a copy too (the store is in copy mode)
    down = os.stat(out / "big.bin")
    assert down.st_size == 64 << 20 and down.st_blocks * 512 < 1 << 20
    assert hashlib.sha256((out / "big.bin").read_bytes()).hexdigest().encode() == sha
