"""JupyterLab as the learner uses it: a real browser runs notebook 03, moves a slider, presses Run, and
switches the panel to its batch timeline view.

nbval runs the notebooks' code, but not what the learner sees: the widgets, the plots, the panel
redrawing after a click. Here JupyterLab is started the way ``make lab`` starts it
(``lab-backends lab`` with ``LAB_TOKEN``), Debian's Chromium is driven headless by Playwright for
Python (``executable_path``, never ``playwright install``), and the batching notebook runs in it
against a real tritonserver started by the notebook's own kernel.

Run All would end with the notebook's last code cell, ``server.stop()``, and a panel whose server is
gone cannot run. So the browser runs every cell above that one, plays with the panel, and then runs
the stop cell: every cell runs, in an order a learner would use.

Screenshots go to ``test-artifacts/browser/`` (git-ignored). The test skips only when
``/usr/bin/chromium`` is missing, with the reason ``make browser-deps`` recorded.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import psutil
import pytest

from lab_backends.server.processes import stop_processes

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")
NOTEBOOK = ROOT / "notebooks" / "03_schedulers_and_dynamic_batching.ipynb"
ARTIFACTS = ROOT / "test-artifacts" / "browser"
#: Written by `make browser-deps` when it could not install Chromium: the reason to skip with.
MISSING_REASON_FILE = ARTIFACTS / "chromium-missing.txt"
#: Needed as root in a container: no sandbox, no GPU, nothing that phones home.
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic",
]
#: JupyterLab settings for a test that must leave the notebook as it found it and see every cell.
LAB_SETTINGS = {
    "@jupyterlab/docmanager-extension/plugin": {"autosave": False},
    "@jupyterlab/notebook-extension/tracker": {"windowingMode": "none"},
    "@jupyterlab/apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False},
}
ERROR_OUTPUT = '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.error"]'
STDERR_OUTPUT = '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]'


def _skip_without_chromium() -> None:
    """Skip loudly: the reason goes to pytest's summary (-ra), to stderr and to the warnings."""
    if CHROMIUM.exists():
        return
    recorded = (
        MISSING_REASON_FILE.read_text().strip().removeprefix("browser-deps: ") if MISSING_REASON_FILE.exists() else ""
    )
    reason = (f"{CHROMIUM} is missing: {recorded or 'not installed'}. "
              "Install Debian's chromium (`make browser-deps`, as root or with sudo) to run the browser test.")
    print(f"\nSKIPPED browser test: {reason}", file=sys.stderr)
    warnings.warn(reason)
    pytest.skip(reason)


def _wait(what: str, condition: Callable[[], Any], timeout_s: float, every_s: float = 0.5) -> Any:
    """Poll ``condition`` until it returns something truthy; fail with ``what`` at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(every_s)


def _api(url: str, token: str, method: str = "GET") -> Any:
    request = urllib.request.Request(url, method=method, headers={"Authorization": f"token {token}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        body = response.read()
    return json.loads(body) if body else None


def _descendants(pid: int) -> list[int]:
    try:
        return [child.pid for child in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _name(pid: int) -> str:
    try:
        return psutil.Process(pid).name()
    except psutil.Error:
        return ""


def _stop_pids(pids: list[int], grace_s: float = 10.0) -> None:
    """SIGTERM these PIDs (ours), wait, then SIGKILL what is left."""
    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            pass
    stop_processes(procs, grace_s)


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """``lab-backends lab`` on a free port with a token; its kernels and servers stopped by PID after."""
    _skip_without_chromium()
    from lab_backends.server.ports import free_ports

    settings = tmp_path / "lab-settings"
    for plugin, values in LAB_SETTINGS.items():
        path = settings / f"{plugin}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
    token, port = os.urandom(16).hex(), free_ports(1)[0]
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_URL", "TRITON_TRACE_FILE")}
    env.update(
        LAB_TOKEN=token, LAB_FAST="1", JUPYTERLAB_SETTINGS_DIR=str(settings),
        JUPYTERLAB_WORKSPACES_DIR=str(tmp_path / "lab-workspaces"),
    )
    log = open(tmp_path / "lab.log", "wb")
    proc = subprocess.Popen(
        [str(ROOT / ".venv" / "bin" / "lab-backends"), "lab", "--port", str(port)],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    seen: set[int] = set()
    try:
        def ready() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"lab-backends lab exited ({proc.returncode}): "
                                     f"{(tmp_path / 'lab.log').read_text()[-2000:]}")
            try:
                return _api(f"{base}/api/status", token) is not None
            except (urllib.error.URLError, OSError):
                return False

        _wait("JupyterLab to answer /api/status", ready, 90)
        yield {"base": base, "token": token, "proc": proc, "seen": seen, "log": tmp_path / "lab.log"}
    finally:
        seen.update(_descendants(proc.pid))  # kernels, and any tritonserver a kernel still runs
        try:
            for kernel in _api(f"{base}/api/kernels", token) or []:
                _api(f"{base}/api/kernels/{kernel['id']}", token, method="DELETE")
        except (urllib.error.URLError, OSError):
            pass
        seen.update(_descendants(proc.pid))
        # tritonserver first, while its stubs live: a server stopped together with its stubs cannot
        # unlink the Python backend's /dev/shm regions (a failed run of this test once left two behind).
        _stop_pids(sorted(pid for pid in seen if _name(pid) == "tritonserver"))
        _stop_pids([proc.pid, *sorted(seen)])
        proc.wait(timeout=10)
        log.close()


def _no_errors(page: Any) -> None:
    """Fail with the text of the first traceback, or of a stderr output that reports an error."""
    errors = page.locator(ERROR_OUTPUT)
    if errors.count():
        raise AssertionError(f"a cell failed in the browser:\n{errors.first.inner_text()[-3000:]}")
    for text in page.locator(STDERR_OUTPUT).all_inner_texts():
        if "Traceback" in text or "Error" in text:
            raise AssertionError(f"a cell wrote an error to stderr:\n{text[-3000:]}")


def _kernel_idle(page: Any) -> bool:
    indicator = page.locator(".jp-Notebook-ExecutionIndicator")
    return indicator.count() > 0 and indicator.first.get_attribute("data-status") == "idle"


def _run_menu(page: Any, item: str) -> None:
    page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
    page.locator(".lm-Menu-itemLabel", has_text=item).first.click()


def answer_dialog(page: Any, seen: list[str], kernel_s: float = 90) -> None:
    """A JupyterLab dialog would take the next click: keep its text (for a failure message) and answer it as a
    learner would. "Select Kernel" (seen in fresh clones when a notebook opens before JupyterLab knows its
    kernels) gets its Select button (Python 3) and the kernel is awaited; any other dialog gets Escape."""
    dialog = page.locator(".jp-Dialog")
    if not (dialog.count() and dialog.first.is_visible()):
        return
    text = dialog.first.inner_text()
    seen.append(text[:300])
    if text.startswith("Select Kernel"):
        dialog.first.locator(".jp-mod-accept").click()
        _wait("the kernel to start", lambda: _kernel_idle(page), kernel_s)
    else:
        page.keyboard.press("Escape")


@contextmanager
def notebook_in_chromium(lab: dict[str, Any], notebook: Path, tmp_path: Path, prefix: str = "",
                         run_all_s: float = 110) -> Iterator[tuple[Any, Any]]:
    """``notebook`` open in headless Chromium, every cell above ``server.stop()`` run; yields (page, stop cell).

    One frame for every browser test: a fresh Chromium profile, the kernel idle, "Run All Above"
    on the stop cell (the menu click is retried: on a loaded machine it is sometimes lost), and the
    exercise's "not attempted yet" output as the sign that all of them ran without an error. After
    the test: a screenshot on failure, the browser closed, JupyterLab's log kept, and the notebook
    restored if JupyterLab saved it (autosave is off; outputs must never reach the repository).
    """
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    original = notebook.read_bytes()
    started = time.monotonic()
    url = f"{lab['base']}/lab/tree/{notebook.name}?token={lab['token']}"
    try:
        with sync_playwright() as playwright:
            context = playwright.chromium.launch_persistent_context(
                user_data_dir=str(tmp_path / "chromium-profile"), executable_path=str(CHROMIUM),
                headless=True, args=CHROMIUM_FLAGS, viewport={"width": 1500, "height": 1100},
            )
            try:
                page = context.pages[0] if context.pages else context.new_page()
                page.set_default_timeout(30_000)
                page.goto(url)
                page.locator(".jp-NotebookPanel .jp-Cell").first.wait_for(timeout=60_000)
                _wait("the kernel to start", lambda: _kernel_idle(page), 60)
                stop_cell = page.locator(".jp-CodeCell", has_text="server.stop()").last
                first_prompt = page.locator(".jp-CodeCell .jp-InputPrompt").first
                dialogs: list[str] = []
                for attempt in range(3):
                    answer_dialog(page, dialogs)
                    try:
                        stop_cell.locator(".jp-InputPrompt").click(timeout=15_000)
                        _run_menu(page, "Run All Above Selected Cell")
                        _wait("the first cell to start",
                              lambda: first_prompt.inner_text().strip() not in ("[ ]:", ""), 20)
                        break
                    except (AssertionError, PlaywrightTimeout) as exc:
                        if attempt == 2:
                            raise AssertionError(f"the run did not start; dialogs seen: {dialogs or 'none'}") from exc
                exercise_output = page.locator(".jp-OutputArea-output", has_text="not attempted yet")

                def ran_all() -> bool:
                    _no_errors(page)
                    return exercise_output.count() > 0 and _kernel_idle(page)

                _wait("the cells above server.stop() to run", ran_all, run_all_s, every_s=1.0)
                yield page, stop_cell
            except BaseException:
                try:
                    page.screenshot(path=str(ARTIFACTS / f"{prefix}failure.png"), full_page=True)
                except Exception:  # noqa: BLE001 - the screenshot is a bonus, the failure is the point
                    pass
                raise
            finally:
                context.close()
    finally:
        if notebook.read_bytes() != original:
            notebook.write_bytes(original)
            pytest.fail(f"JupyterLab saved {notebook.name} during the test; restored the stored version")
        shutil.copy(lab["log"], ARTIFACTS / f"jupyterlab{'-' + prefix.rstrip('-') if prefix else ''}.log")
    print(f"{prefix}browser test took {time.monotonic() - started:.0f} s; screenshots in {ARTIFACTS}")


def run_stop_cell(page: Any, stop_cell: Any) -> None:
    """Last, the cell that stops the notebook's server; it must run without an error."""
    stop_cell.locator(".jp-InputPrompt").click()
    _run_menu(page, "Run Selected Cell")
    _wait(
        "server.stop() to run",
        lambda: (
            _kernel_idle(page)
            and stop_cell.locator(".jp-InputPrompt").inner_text().strip() not in ("[ ]:", "[*]:")
        ),
        30,
    )
    _no_errors(page)


@pytest.mark.server
@pytest.mark.slow
def test_batching_notebook_in_chromium(lab: dict[str, Any], tmp_path: Path) -> None:
    with notebook_in_chromium(lab, NOTEBOOK, tmp_path) as (page, stop_cell):
        page.screenshot(path=str(ARTIFACTS / "01-after-run-all.png"), full_page=True)

        # The panel: its image, the concurrency slider, the Run button, the status line.
        image = page.locator(".jupyter-widgets.widget-image").last
        image.scroll_into_view_if_needed()
        _wait("the panel's first plot", lambda: image.evaluate("img => img.naturalWidth > 0"), 30)
        before_src, before_png = image.get_attribute("src"), image.screenshot()
        slider = page.locator(".widget-slider", has_text="concurrency (client)").last
        readout = slider.locator(".widget-readout")
        old_value = readout.inner_text().strip()
        # The plot is taller than the viewport: bring the slider itself into view before
        # reading its coordinates, or the drag lands outside the page (seen in CI).
        slider.scroll_into_view_if_needed()
        handle, track = (
            slider.locator(".noUi-handle").bounding_box(),
            slider.locator(".noUi-target").bounding_box(),
        )
        page.mouse.move(handle["x"] + handle["width"] / 2, handle["y"] + handle["height"] / 2)
        page.mouse.down()
        page.mouse.move(track["x"] + track["width"] * 0.08, handle["y"] + handle["height"] / 2, steps=8)
        page.mouse.up()
        moved = lambda: (v := readout.inner_text().strip()) != old_value and v  # noqa: E731
        try:
            new_value = _wait("the slider to move (drag)", moved, 10)
        except AssertionError:
            # A learner can also use the keyboard: focus the handle and step it down.
            slider.locator(".noUi-handle").focus()
            for _ in range(10):
                page.keyboard.press("ArrowLeft")
            new_value = _wait("the slider to move (keyboard)", moved, 10)
        page.locator(".widget-button", has_text="Run").last.click()
        status = page.locator(".widget-html", has_text="req/s").last
        _wait(f"the panel to report a run at c={new_value}",
              lambda: f"c={new_value}:" in (status.inner_text() if status.count() else ""), 60)
        _wait("the plot to be redrawn", lambda: image.get_attribute("src") != before_src, 20)
        after_png = image.screenshot()
        image.screenshot(path=str(ARTIFACTS / "02-panel-after-run.png"))
        page.screenshot(path=str(ARTIFACTS / "03-after-widget-run.png"), full_page=True)
        assert after_png != before_png, "the panel's image did not change after Run"
        assert page.locator(".widget-html span[style*='#b00020']").count() == 0, \
            f"the panel reported an error: {status.inner_text()}"
        _no_errors(page)

        # The view toggle: the last plot becomes the batch timeline of the same run.
        before_src = image.get_attribute("src")
        page.locator(".widget-toggle-button", has_text="batch timeline").last.click()
        _wait("the batch timeline to be drawn", lambda: image.get_attribute("src") != before_src, 20)
        image.screenshot(path=str(ARTIFACTS / "02b-panel-batch-timeline.png"))
        assert image.screenshot() != after_png, "the panel's image did not change with the batch timeline view"
        _no_errors(page)

        run_stop_cell(page, stop_cell)
        page.screenshot(path=str(ARTIFACTS / "04-done.png"), full_page=True)
