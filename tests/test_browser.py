"""The course as a person sees it: JupyterLab in a real browser, the decay-factor notebook run, its
slider moved, and the plot redrawn.

JupyterLab runs headless on 127.0.0.1 (free port, token) and serves a copy of the notebook with its
CI sizes injected by papermill (prepared, not executed). Debian's chromium is driven by Playwright
(no browser download). A screenshot is kept in test-artifacts/ (git-ignored).

Skipped, with the reason shown, when chromium, Playwright or JupyterLab is missing, unless
SPARSITY_LAB_REQUIRE_BROWSER=1 (set by .ci/run), where a missing piece fails the test.
"""
from __future__ import annotations

import importlib.util
import json
import os
import secrets
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from _notebooks import FIGURE_CELL, WIDGET_CELL, tiny_notebook
from sparsity_lab.course import NOTEBOOK_DIR, build_course, execute
from sparsity_lab.course.command import free_port, lab_command

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"]
NOTEBOOK = NOTEBOOK_DIR / "03_ste_flip_rate.ipynb"
SLIDER_WORD = "decay"
ARTIFACTS = ROOT / "test-artifacts"

# JupyterLab user settings: no news prompt or update check, and every cell rendered (no windowing)
# so the widget outputs are in the page while the test reads them.
LAB_SETTINGS = {
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"fetchNews": "false",
                                                                        "checkForUpdates": False},
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
}

# Every trace path, image and title of a plotly figure: changes when the plot is redrawn with new data.
SIGNATURE_JS = """el => Array.from(el.querySelectorAll('.scatterlayer path.js-line, .barlayer path, image, .gtitle'))
    .map(n => n.getAttribute('d') || n.getAttribute('href') || n.textContent).join('|')"""

# The error outputs of the open notebook, read from JupyterLab's notebook model.
ERRORS_JS = """() => { const cells = window.jupyterapp.shell.currentWidget.content.model.cells; const found = [];
    for (let i = 0; i < cells.length; i++) { const c = cells.get(i); if (c.type !== 'code') continue;
        for (let j = 0; j < c.outputs.length; j++) { const o = c.outputs.get(j).toJSON();
            if (o.output_type === 'error') found.push(o.ename + ': ' + o.evalue); } }
    return found; }"""


def _missing() -> list[str]:
    missing = [] if Path(CHROMIUM).exists() else [f"{CHROMIUM} (apt-get install chromium)"]
    for module, extra in (("playwright", "playwright"), ("jupyterlab", "jupyterlab")):
        if importlib.util.find_spec(module) is None:
            missing.append(f"{extra} (pip install -e '.[test]')")
    return missing


def require_browser() -> None:
    """Skip (reason shown) when a piece is missing; fail instead under SPARSITY_LAB_REQUIRE_BROWSER=1."""
    missing = _missing()
    if missing:
        reason = "the browser test needs " + ", ".join(missing)
        if os.environ.get("SPARSITY_LAB_REQUIRE_BROWSER") == "1":
            pytest.fail(reason + " (SPARSITY_LAB_REQUIRE_BROWSER=1: CI must run it)")
        pytest.skip(reason)


@pytest.fixture(scope="module")
def browser_ready():
    require_browser()


def _wait_for_server(url: str, proc: subprocess.Popen, log: Path, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"jupyter lab exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise TimeoutError(f"jupyter lab did not answer {url} in {seconds} s:\n{log.read_text()[-3000:]}")


@pytest.fixture
def lab(tmp_path, browser_ready):
    """JupyterLab serving tmp_path/notebooks (the notebook with CI sizes); yields (base URL, token)."""
    root = tmp_path / "notebooks"
    execute(NOTEBOOK, root / NOTEBOOK.name, sizes="ci", prepare_only=True)
    settings = tmp_path / "lab-settings"
    for name, values in LAB_SETTINGS.items():
        (settings / name).parent.mkdir(parents=True, exist_ok=True)
        (settings / name).write_text(json.dumps(values))
    token, port = secrets.token_hex(16), free_port("127.0.0.1")
    env = dict(os.environ, JUPYTER_TOKEN=token, JUPYTERLAB_SETTINGS_DIR=str(settings),
               JUPYTERLAB_WORKSPACES_DIR=str(tmp_path / "workspaces"), JUPYTER_CONFIG_DIR=str(tmp_path / "config"))
    cmd = lab_command(root, "127.0.0.1", port, no_browser=True,
                      extra=["--ServerApp.allow_root=True", "--LabApp.expose_app_in_browser=True"])
    log = tmp_path / "jupyter.log"
    with open(log, "w") as sink:
        proc = subprocess.Popen(cmd, env=env, stdout=sink, stderr=subprocess.STDOUT, cwd=tmp_path)
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_for_server(f"{base}/api/status?token={token}", proc, log)
        yield base, token, log
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _screenshot(page, name: str) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / name
    page.screenshot(path=str(path))
    print(f"screenshot: {path}")
    return path


def test_decay_slider_redraws_the_plot_in_jupyterlab(lab):
    from playwright.sync_api import sync_playwright

    base, token, log = lab
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        try:
            _run_and_move_the_slider(page, f"{base}/lab/tree/{NOTEBOOK.name}?token={token}&reset")
        except Exception:
            _screenshot(page, f"browser_{NOTEBOOK.stem}_failed.png")
            print("jupyter log (tail):\n" + log.read_text()[-3000:])
            raise
        finally:
            browser.close()


def _run_and_move_the_slider(page, url: str) -> None:
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    page.goto(url, timeout=60_000)
    page.wait_for_function("() => window.jupyterapp && window.jupyterapp.shell.currentWidget"
                           " && window.jupyterapp.shell.currentWidget.sessionContext"
                           " && window.jupyterapp.shell.currentWidget.sessionContext.session"
                           " && window.jupyterapp.shell.currentWidget.sessionContext.session.kernel"
                           " && window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.status === 'idle'",
                           timeout=60_000)
    page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")

    # The decay slider: an ipywidgets slider whose description names the decay.
    slider = page.locator(".widget-slider").filter(has=page.locator(".widget-label", has_text=SLIDER_WORD)).first
    slider.wait_for(state="visible", timeout=75_000)
    page.wait_for_function("() => !Array.from(document.querySelectorAll('.jp-InputPrompt'))"
                           ".some(p => p.textContent.includes('[*]'))", timeout=60_000)
    errors = page.evaluate(ERRORS_JS)
    assert not errors, "a cell raised: " + "\n".join(errors)[:3000]

    # The plot that the slider drives sits in the same widget box as the slider.
    box = page.locator(".widget-vbox").filter(has=slider).last
    plot = box.locator(".js-plotly-plot").first
    plot.scroll_into_view_if_needed()
    page.wait_for_function(f"el => ({SIGNATURE_JS})(el).includes('M')", arg=plot.element_handle(), timeout=30_000)
    before, readout = plot.evaluate(SIGNATURE_JS), slider.locator(".widget-readout").inner_text()

    handle = slider.locator(".noUi-handle").first
    handle.focus()
    at_max = handle.get_attribute("aria-valuenow") == handle.get_attribute("aria-valuemax")
    page.keyboard.press("ArrowLeft" if at_max else "ArrowRight")
    try:  # the redraw arrives through the kernel: wait for it, then let the asserts below judge
        page.wait_for_function(f"([el, old]) => ({SIGNATURE_JS})(el) !== old", arg=[plot.element_handle(), before],
                               timeout=30_000)
    except PlaywrightTimeout:
        pass
    after = plot.evaluate(SIGNATURE_JS)
    moved_to = slider.locator(".widget-readout").inner_text()
    slider.scroll_into_view_if_needed()
    shot = _screenshot(page, f"browser_{NOTEBOOK.stem}.png")

    assert moved_to != readout, f"the slider did not move (readout stayed {readout!r})"
    assert after != before, "the plot did not change when the slider moved"
    assert shot.stat().st_size > 10_000, f"{shot} looks empty"
    print(f"slider {readout} -> {moved_to}: plot redrawn")


def test_book_pages_draw_their_plotly_figures_offline(tmp_path, browser_ready):
    """A book page, opened from disk with no network: the figure and the FigureWidget's snapshot are
    drawn by the plotly.js that the book serves itself."""
    from playwright.sync_api import sync_playwright

    tiny_notebook(tmp_path / "notebooks", body=[FIGURE_CELL, WIDGET_CELL])
    index = build_course(out=tmp_path / "book", directory=tmp_path / "notebooks", progress=False)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page()
        page.route("http*://**", lambda route: route.abort())  # offline, as on this machine
        try:
            page.goto((index.parent / "01_tiny.html").as_uri())
            page.wait_for_function("() => document.querySelectorAll('.js-plotly-plot .main-svg').length >= 2",
                                   timeout=30_000)
            drawn = page.locator(".js-plotly-plot .scatterlayer path.js-line").count()
        finally:
            browser.close()
    assert drawn == 2, f"expected the figure and the snapshot to draw one line each, found {drawn}"


def test_a_missing_browser_skips_with_its_reason_or_fails_in_ci(monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "CHROMIUM", "/no/such/chromium")
    monkeypatch.delenv("SPARSITY_LAB_REQUIRE_BROWSER", raising=False)
    with pytest.raises(pytest.skip.Exception, match="/no/such/chromium"):
        require_browser()
    monkeypatch.setenv("SPARSITY_LAB_REQUIRE_BROWSER", "1")
    with pytest.raises(pytest.fail.Exception, match="CI must run it"):
        require_browser()


def test_chromium_path_is_what_ci_installs():
    """.ci/run installs Debian's chromium at the path this test drives (no Playwright browser download)."""
    ci = (ROOT / ".ci" / "run").read_text()
    assert "apt-get install -y chromium" in ci and "SPARSITY_LAB_REQUIRE_BROWSER=1" in ci
