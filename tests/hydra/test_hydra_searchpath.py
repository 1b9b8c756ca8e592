"""The search-path plugin: a Hydra app with its own config and no mention of expr_tracker
can say +tracker=default ... +tracker/alerts=nan_guard."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("hydra")

APP = textwrap.dedent(
    """
    import json
    import hydra
    from omegaconf import DictConfig
    import expr_tracker as et

    @hydra.main(version_base="1.3", config_path="conf", config_name="config")
    def main(cfg: DictConfig) -> None:
        run = et.init(spec=cfg.tracker, config={"lr": cfg.lr})
        et.log({"loss": 0.5})
        print(json.dumps({
            "buffer": run.spec.history.buffer.size,
            "rules": sorted(r.name for r in run.spec.alerts.rules),
            "dir": str(run.dir),
        }))
        et.finish()

    if __name__ == "__main__":
        main()
    """
)


@pytest.fixture
def app(tmp_path):
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "config.yaml").write_text("lr: 0.1\n")
    (tmp_path / "app.py").write_text(APP)
    return tmp_path


def _run(app, *args):
    return subprocess.run(
        [sys.executable, "app.py", *args],
        cwd=app,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.slow
def test_app_composes_tracker_group_via_plugin(app):
    proc = _run(
        app,
        "+tracker=default",
        "tracker.history.buffer.size=100",
        "+tracker/alerts=nan_guard",
        "tracker.project=sp",
        "tracker.name=one",
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["buffer"] == 100
    assert out["rules"] == ["et_nan_guard"]
    assert (app / "runs" / "sp" / "one" / "metrics.jsonl").exists()


def test_info_searchpath_lists_the_package(app):
    proc = _run(app, "--info", "searchpath")
    assert proc.returncode == 0, proc.stderr
    assert "pkg://expr_tracker.conf" in proc.stdout
    assert "expr_tracker" in proc.stdout


def test_plugin_is_discovered_and_idempotent():
    from hydra._internal.config_search_path_impl import ConfigSearchPathImpl
    from hydra.core.config_search_path import ConfigSearchPath  # noqa: F401
    from hydra.core.plugins import Plugins
    from hydra.plugins.search_path_plugin import SearchPathPlugin

    from expr_tracker.hydra import SEARCH_PATH, ExprTrackerSearchPathPlugin

    found = Plugins.instance().discover(SearchPathPlugin)
    assert ExprTrackerSearchPathPlugin in found
    path = ConfigSearchPathImpl()
    plugin = ExprTrackerSearchPathPlugin()
    plugin.manipulate_search_path(path)
    plugin.manipulate_search_path(path)
    assert [e.path for e in path.get_path()].count(SEARCH_PATH) == 1


def test_group_files_are_packaged_with_the_package():
    from importlib.resources import files

    tracker = files("expr_tracker.conf") / "tracker"
    names = {p.name for p in tracker.iterdir()}
    assert {"default.yaml", "minimal.yaml", "timeline.yaml", "profile.yaml", "alerts"} <= names
    alerts = {p.name for p in (tracker / "alerts").iterdir()}
    assert {"nan_guard.yaml", "divergence.yaml", "hung_run.yaml", "system.yaml"} <= alerts
