"""The request inspector as a learner uses it: notebook 11 in JupyterLab, a digit drawn with the mouse.

Same JupyterLab and Chromium set-up as :mod:`test_lab_in_browser` (its ``lab`` fixture and helpers
are reused). The browser runs every cell above ``server.stop()``, clears the pad, draws a 7 with
mouse moves on the ipycanvas, picks gRPC and presses Send 1, then REST binary and Send 1 again, and
checks from the page that the answer chart, the wire view and the waterfall appeared and that no
error is shown. Screenshots go to ``test-artifacts/browser/inspector-*.png``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from .test_lab_in_browser import ARTIFACTS, ROOT, _no_errors, _wait, notebook_in_chromium, run_stop_cell

NOTEBOOK = ROOT / "notebooks" / "11_one_request_end_to_end.ipynb"
#: The stroke of a 7 in pad cells (row, column), as a learner would drag it.
STROKE = [(1, 1), (1, 6), (3, 5), (6, 3)]
CELL = 24


def _draw(page: Any, pad: Any) -> None:
    box = pad.bounding_box()
    point = lambda rc: (box["x"] + (rc[1] + 0.5) * CELL, box["y"] + (rc[0] + 0.5) * CELL)  # noqa: E731
    page.mouse.move(*point(STROKE[0]))
    page.mouse.down()
    for cell in STROKE[1:]:
        page.mouse.move(*point(cell), steps=12)
    page.mouse.up()


def _send(page: Any, panel: Any, protocol: str) -> str:
    panel.locator(".widget-toggle-button", has_text=protocol).first.click()
    panel.locator(".widget-button", has_text="Send 1").first.click()
    status = panel.locator(".widget-html", has_text="answered").first
    _wait(
        f"the panel to report a request over {protocol}",
        lambda: status.count() > 0 and f"over {protocol} in" in status.inner_text(),
        60,
    )
    return status.inner_text()


@pytest.mark.server
@pytest.mark.slow
def test_inspector_notebook_in_chromium(lab: dict[str, Any], tmp_path: Path) -> None:
    with notebook_in_chromium(lab, NOTEBOOK, tmp_path, prefix="inspector-", run_all_s=120) as (page, stop_cell):
        panel = page.locator(".lab-request-inspector").first
        panel.scroll_into_view_if_needed()
        panel.locator(".widget-button", has_text="Clear").first.click()
        pad = panel.locator(".lab-digit-pad").first
        pad.scroll_into_view_if_needed()
        time.sleep(1.0)  # let the kernel's redraw of the cleared pad arrive
        blank = pad.screenshot()
        _draw(page, pad)
        # The kernel paints the pad from the mouse events it received: a changed picture
        # means the strokes reached the kernel's image, not only the browser.
        _wait("the kernel to paint the strokes", lambda: pad.screenshot() != blank, 20)
        page.screenshot(path=str(ARTIFACTS / "inspector-01-drawn.png"))

        grpc_status = _send(page, panel, "gRPC")
        binary_status = _send(page, panel, "REST binary")
        for css in (".lab-inspector-answer", ".lab-inspector-waterfall"):
            image = panel.locator(css).first
            _wait(
                f"{css} to show a picture",
                lambda image=image: image.evaluate("img => img.naturalWidth > 0"),
                20,
            )
        wire_view = panel.locator(".lab-inspector-wire").first
        _wait(
            "the wire view of the REST binary request",
            lambda: "Inference-Header-Content-Length" in wire_view.inner_text(),
            20,
        )
        wire = wire_view.inner_text()
        assert "Inference-Header-Content-Length" in wire and "POST /v2/models/" in wire, wire[:500]
        assert "Where each figure came from" in panel.locator(".lab-inspector-details").first.inner_text()
        assert panel.locator(".widget-html span[style*='#b00020']").count() == 0
        _no_errors(page)
        panel.screenshot(path=str(ARTIFACTS / "inspector-02-panel.png"))
        print(f"gRPC: {grpc_status}\nREST binary: {binary_status}")
        run_stop_cell(page, stop_cell)
