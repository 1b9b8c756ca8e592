"""A Hydra group file holding OmegaConf interpolations (``${oc.select:...}``, as the shipped
rule sets do) checked on its own: `et config validate` and `et rules check` say, at the
value's path, that the interpolation is not resolved there and the composed config must be
validated, instead of reporting the ``${...}`` text as a rule syntax error; the file's other
problems are still errors."""

from __future__ import annotations

from pathlib import Path

import pytest

import expr_tracker
from expr_tracker.cli.main import main
from expr_tracker.spec.yaml import interpolation

NAN_GUARD = Path(expr_tracker.__file__).parent / "conf" / "tracker" / "alerts" / "nan_guard.yaml"

GROUP = """\
# @package tracker
history:
  buffer:
    size: ${oc.select:...size,50}
    szie: 3
alerts:
  rules:
    high:
      condition: "${oc.select:...metric,loss} > ${oc.select:...limit,5}"
      level: error
      message: "value {${oc.select:...metric,loss}}"
    broken: "loss >"
"""


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    monkeypatch.delenv("ET_CONFIG", raising=False)
    monkeypatch.delenv("ET_ALERT_CONFIG", raising=False)


def test_shipped_rule_set_says_validate_the_composed_config(capsys):
    assert main(["config", "validate", str(NAN_GUARD)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].startswith("SUCCESS:")
    warning = next(x for x in lines if "alerts.rules.et_nan_guard.condition" in x)
    assert warning.strip().startswith(f"warning: {NAN_GUARD}:")
    assert "interpolation `${oc.select:...guard_metric,loss}`" in warning
    assert "validate the composed config" in warning and "docs/cli.md" in warning


def test_group_file_reports_real_errors_and_interpolations_at_their_paths(tmp_path, capsys):
    f = tmp_path / "mine.yaml"
    f.write_text(GROUP)
    assert main(["config", "validate", str(f)]) == 1  # szie and the broken rule
    out = capsys.readouterr().out
    assert "unexpected '$'" not in out and "syntax error at column 1" not in out
    assert f"{f}:5:5: history.buffer.szie: unknown key" in out
    assert "alerts.rules.broken: syntax error" in out
    warnings = [x.strip() for x in out.splitlines() if x.strip().startswith("warning:")]
    assert [w.split(": ")[2] for w in warnings] == [
        "history.buffer.size",
        "alerts.rules.high.condition",
        "alerts.rules.high.message",
    ]
    assert warnings[0].startswith(f"warning: {f}:4:11: ")
    # without the real errors the file passes, the interpolations still said
    f.write_text(GROUP.replace("    szie: 3\n", "").replace('    broken: "loss >"\n', ""))
    assert main(["config", "validate", str(f)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("SUCCESS:") and out.count("warning:") == 3


def test_rules_check_warns_instead_of_a_syntax_error(tmp_path, capsys):
    f = tmp_path / "mine.yaml"
    f.write_text(GROUP.replace('    broken: "loss >"\n', ""))
    assert main(["rules", "check", str(f)]) == 0
    out = capsys.readouterr().out
    assert "syntax error" not in out
    assert "WARNING: holds a Hydra/OmegaConf interpolation `${oc.select:...metric,loss}`" in out


def test_interpolation_finder():
    assert interpolation("a ${oc.select:...m,loss} b") == "${oc.select:...m,loss}"
    assert interpolation("${oc.select:${x},y}") == "${oc.select:${x},y}"
    assert interpolation(r"\${not.one}") is None  # OmegaConf's escape
    assert interpolation("loss is {loss}") is None and interpolation(3) is None
