"""A sync pass does not read again the content-addressed media files its manifest already
holds (docs/team.md "Sync during training": a pass every interval must not re-hash the
whole media folder)."""

from __future__ import annotations

import hashlib
import json

from expr_tracker.history import untrusted
from expr_tracker.sync.upload import sync_dir


def test_second_pass_does_not_reopen_hashed_media(tmp_path, monkeypatch):
    run = tmp_path / "runs" / "proj" / "r1"
    (run / "media").mkdir(parents=True)
    (run / "metrics.jsonl").write_text(json.dumps({"_step": 0, "loss": 1.0}) + "\n")
    for i in range(3):
        data = b"png%d" % i
        (run / "media" / f"{hashlib.sha256(data).hexdigest()}.png").write_bytes(data)
    url = f"file://{tmp_path / 'bucket'}"
    assert sync_dir(tmp_path / "runs", url, state_dir=tmp_path / "s").errors == []
    with open(run / "metrics.jsonl", "a") as f:  # the run goes on: the producer changed
        f.write(json.dumps({"_step": 1, "loss": 0.5}) + "\n")
    opened = []
    real = untrusted.open_regular

    def counting(path, *a, **k):
        opened.append(str(path))
        return real(path, *a, **k)

    monkeypatch.setattr(untrusted, "open_regular", counting)
    rep = sync_dir(tmp_path / "runs", url, state_dir=tmp_path / "s")
    assert rep.errors == [] and rep.commits == 1
    assert [p for p in opened if "/media/" in p] == []
