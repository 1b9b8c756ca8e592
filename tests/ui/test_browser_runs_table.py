"""The runs table's config and summary columns in a real headless Chromium: the config keys
that differ shown by default, a column asked for, a header click sorting (and the order kept
in the URL, so a reload shows the same), a filter (``lr > 1e-3``, ``status = failed``) and a
filter that does not parse, said so. Screenshots go to ``test-artifacts/ui/``."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from urllib.parse import unquote

import pytest
from test_browser import browser, page, shot  # noqa: F401 - the fixtures of the browser tests
from ui_support import Server, env

pytestmark = pytest.mark.slow

WRITER = textwrap.dedent(
    """
    import sys, expr_tracker as et
    runs = [("a", 0.1, 32, 0, 0.9), ("b", 0.01, 64, 1, 0.5), ("c", 0.0001, 32, 2, 0.7),
            ("d", 0.003, 64, 3, 0.2)]
    for name, lr, batch, seed, loss in runs:
        et.init(project="sweep", name=name, dir=sys.argv[1],
                config={"lr": lr, "batch": batch, "seed": seed, "model": {"depth": 4}})
        for i in range(5):
            et.log({"train/loss": loss + (4 - i) / 10})
        et.summary["best_acc"] = 1 - loss
        et.finish(exit_code=1 if name == "c" else 0)
    """
)


@pytest.fixture(scope="module")
def sweep_server(tmp_path_factory):
    root = tmp_path_factory.mktemp("sweep") / "runs"
    subprocess.run([sys.executable, "-c", WRITER, str(root)], check=True, env=env(), timeout=120)
    s = Server(root, tmp_path_factory.mktemp("sweep-cache"))
    yield s
    s.close()


def order(pg) -> list[str]:
    rows = pg.locator("#runs-body tr")
    return [rows.nth(i).get_attribute("data-run") for i in range(rows.count())]


def column_texts(pg, column: str) -> list[str]:
    return pg.eval_on_selector_all(
        f'#runs-body td[data-column="{column}"]', "(tds) => tds.map((td) => td.textContent)"
    )


def test_config_columns_sort_and_filter(page, sweep_server):  # noqa: F811
    page.set_default_timeout(120_000)  # a loaded test machine: the waits below say what
    page.goto(sweep_server.open(), wait_until="domcontentloaded")
    page.wait_for_selector("#runs-body tr")
    heads = page.eval_on_selector_all("#runs th", "(ths) => ths.map((th) => th.textContent)")
    # the config keys that differ between the runs, model.depth (the same in all) not
    assert {"lr", "batch", "seed"} <= set(heads) and "depth" not in " ".join(heads)
    assert sorted(column_texts(page, "config.lr")) == ["0.0001", "0.003", "0.01", "0.1"]

    # a header click sorts ascending, a second descending; the order is in the URL
    page.click('th[data-column="config.lr"]')
    page.wait_for_function("location.hash.includes('sort=config.lr')")
    page.wait_for_selector('th[data-column="config.lr"]:has-text("▲")')
    assert order(page) == ["sweep/c", "sweep/d", "sweep/b", "sweep/a"]
    page.click('th[data-column="config.lr"]')
    page.wait_for_selector('th[data-column="config.lr"]:has-text("▼")')
    assert order(page) == ["sweep/a", "sweep/b", "sweep/d", "sweep/c"]
    assert "sort=-config.lr" in unquote(page.url)

    # a summary column asked for, sorted by; a reload keeps columns and order
    page.fill("#filter-columns", "lr,summary.best_acc")
    page.press("#filter-columns", "Enter")
    page.wait_for_selector('th[data-column="summary.best_acc"]')
    page.click('th[data-column="summary.best_acc"]')
    page.wait_for_selector('th[data-column="summary.best_acc"]:has-text("▲")')
    assert order(page) == ["sweep/a", "sweep/c", "sweep/b", "sweep/d"]
    page.reload()
    page.wait_for_selector('th[data-column="summary.best_acc"]:has-text("▲")')
    assert order(page) == ["sweep/a", "sweep/c", "sweep/b", "sweep/d"]
    assert page.locator('th[data-column="config.batch"]').count() == 0

    # a filter: lr > 1e-3 keeps three runs; with `status = failed` none of them
    page.fill("#filter-where", "lr > 1e-3")
    page.press("#filter-where", "Enter")
    page.wait_for_function("document.querySelectorAll('#runs-body tr').length === 3")
    assert set(order(page)) == {"sweep/a", "sweep/b", "sweep/d"}
    assert "where=lr > 1e-3" in unquote(page.url).replace("+", " ")
    shot(page, "runs-columns")
    page.fill("#filter-where", "status = failed or batch = 64")
    page.press("#filter-where", "Enter")
    # three rows before and after: wait for the new three, not for a count already true
    page.wait_for_function(
        """() => { const runs = [...document.querySelectorAll('#runs-body tr')]
                     .map((tr) => tr.dataset.run).sort().join(',');
                   return runs === 'sweep/b,sweep/c,sweep/d'; }"""
    )
    assert set(order(page)) == {"sweep/b", "sweep/c", "sweep/d"}

    # a filter that does not parse: said so, with where; every run still listed
    page.fill("#filter-where", "lr >")
    page.press("#filter-where", "Enter")
    page.wait_for_selector("#table-problem")
    assert "ends too early" in page.inner_text("#table-problem")
    assert len(order(page)) == 4
    shot(page, "runs-filter-error")
