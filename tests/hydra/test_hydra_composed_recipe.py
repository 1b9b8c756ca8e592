"""docs/cli.md's recipe for checking what a Hydra app really gets: compose with
``--cfg job --resolve``, then ``et config validate`` / ``et rules check`` the file, and give
the same file to ``et.init(spec=...)`` (its top-level ``tracker:`` section is the spec)."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers import ROOT

pytest.importorskip("hydra")

import expr_tracker as et  # noqa: E402
from expr_tracker.cli.main import main  # noqa: E402

APP = textwrap.dedent(
    """
    import hydra
    from omegaconf import DictConfig
    import expr_tracker as et

    @hydra.main(version_base="1.3", config_path="conf", config_name="config")
    def main(cfg: DictConfig) -> None:
        et.init(spec=cfg.tracker, config={"lr": cfg.lr})
        et.finish()

    if __name__ == "__main__":
        main()
    """
)
OVERRIDES = ["+tracker=default", "+tracker/alerts=[nan_guard]", "tracker.project=recipe"]
DOC = ROOT / "docs" / "cli.md"


def _compose(app: Path, *flags: str) -> Path:
    proc = subprocess.run(
        [sys.executable, "app.py", *OVERRIDES, "--cfg", "job", *flags],
        cwd=app,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    out = app / ("composed.yaml" if flags else "unresolved.yaml")
    out.write_text(proc.stdout)
    return out


def test_docs_recipe_resolves_interpolations():
    recipe = re.search(r"python app\.py \+tracker=default --cfg job[^\n]*", DOC.read_text())
    assert recipe and "--resolve" in recipe.group(0).split(), recipe


@pytest.mark.slow
def test_composed_recipe_in_a_real_hydra_app(tmp_path, capsys, monkeypatch):
    for var in ("ET_CONFIG", "ET_ALERT_CONFIG", "ET_SLACK_WEBHOOK_URL", "WEBHOOK_URL"):
        monkeypatch.delenv(var, raising=False)
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "config.yaml").write_text("lr: 0.1\n")
    (tmp_path / "app.py").write_text(APP)

    # without --resolve the shipped rule set keeps ${oc.select:...}: not checkable
    unresolved = _compose(tmp_path)
    assert "${oc.select:" in unresolved.read_text()
    assert main(["config", "validate", str(unresolved)]) == 0
    assert "interpolation" in capsys.readouterr().out

    composed = _compose(tmp_path, "--resolve")  # the recipe
    assert "${" not in composed.read_text()
    assert main(["config", "validate", str(composed)]) == 0
    assert main(["rules", "check", str(composed)]) == 0
    out = capsys.readouterr()
    assert "interpolation" not in out.out + out.err
    assert "SUCCESS" in out.out

    run = et.init(dir=str(tmp_path / "runs"), spec=str(composed))
    try:
        assert run.spec.project == "recipe"
        [rule] = run.spec.alerts.rules
        assert rule.name == "et_nan_guard" and "isnan(`loss`)" in rule.condition
    finally:
        et.finish()
