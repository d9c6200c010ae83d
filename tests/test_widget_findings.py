"""Issue 25, item 6: what a learner saw of notebook 03's BatchingPanel in a real browser, driven here
through the panel's Python objects (callbacks, widget children, values), no browser.

Most tests stand the server in with a fake (the panel only reads the model's config and reloads
it) and the load with a stub; the last one runs the panel on a real Triton with ``cost_model``,
from a thread other than the one that built it, as a widget callback may run.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pandas as pd
import pytest

from lab_backends.lessons import widgets
from lab_backends.lessons.panel_timeline import label_batches
from lab_backends.measure.plots_batches import batch_timeline
from lab_backends.paths import MODEL_REPOSITORY
from lab_backends.server.repository import read_config

MODEL = "cost_model"


class FakeServer:
    """What the panel asks of a server before its load: the config, and reloads (recorded)."""

    trace_file = None

    def __init__(self) -> None:
        self.loads: list = []

    def model_config(self, name: str):
        return read_config(MODEL_REPOSITORY / name)

    def load_model(self, name: str, config=None, files=None) -> None:
        self.loads.append((name, config))


def _images(widget) -> list:
    import ipywidgets as w

    found = [widget] if isinstance(widget, w.Image) else []
    for child in getattr(widget, "children", ()):
        found += _images(child)
    return found


def _wait(condition, seconds: float) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


def test_no_image_before_the_first_run() -> None:
    """Finding: an empty Image shows as a broken-image icon until the first Run."""
    panel = widgets.BatchingPanel(FakeServer(), MODEL)
    assert _images(panel.widget) == [] and "after the first <b>Run</b>" in panel.placeholder.value


def test_a_load_past_its_deadline_ends_in_the_panel_and_run_comes_back_when_it_ends(monkeypatch) -> None:
    """Finding: the panel sat at "running 4 in flight..." for 120 s+ and never recorded the run."""
    release = threading.Event()

    def stuck_load(*_args, **_kwargs):
        release.wait(30)
        raise RuntimeError("the stuck load ended")

    monkeypatch.setattr(widgets, "run_closed", stuck_load)
    server = FakeServer()
    panel = widgets.BatchingPanel(server, MODEL, concurrency=4, deadline_s=0.2)
    said = panel._set_status

    def late_status(text: str, error: bool = False) -> None:
        if "too late to count" in text:
            time.sleep(0.3)  # forces what a busy machine may do: the worker is slow to write the late end's status
        said(text, error)

    monkeypatch.setattr(panel, "_set_status", late_status)
    started = time.monotonic()
    panel.run_button.click()  # what a learner's click does
    waited = time.monotonic() - started
    assert 0.2 <= waited < 5, waited
    assert len(server.loads) == 1 and panel.runs == []
    assert "did not finish within 0.2 s" in panel.status.value and "4 in flight" in panel.status.value
    assert "server.is_ready()" in panel.status.value and "#b00020" in panel.status.value
    assert panel.error.startswith("the load (4 in flight")
    assert panel.run_button.disabled  # a second load beside the stuck one would measure both
    assert panel.run() is None and "still running" in panel.status.value and len(server.loads) == 1
    release.set()
    assert _wait(lambda: not panel.run_button.disabled, 10), panel.status.value
    assert "failed (RuntimeError: the stuck load ended)" in panel.status.value
    assert "too late to count" in panel.status.value and panel.runs == []


@pytest.mark.parametrize("where", ["in the load", "after the load"])
def test_any_exception_of_a_run_ends_in_the_panel(monkeypatch, where) -> None:
    """An exception of an unforeseen type used to escape the callback: the status stayed on "running..."."""

    class Result:
        def row(self):
            raise KeyError("throughput_rps")

    def load(*_args, **_kwargs):
        if where == "in the load":
            raise RuntimeError("Cannot switch to a different thread")
        return Result()

    monkeypatch.setattr(widgets, "run_closed", load)
    panel = widgets.BatchingPanel(FakeServer(), MODEL)
    worker = threading.Thread(target=panel.run_button.click)  # a callback may run on another thread
    worker.start()
    worker.join(30)
    kind = "RuntimeError" if where == "in the load" else "KeyError"
    assert f"unexpected {kind} during the run" in panel.status.value and "#b00020" in panel.status.value
    assert "Traceback" in panel.error and not panel.run_button.disabled and panel.runs == []


def test_a_failed_redraw_of_the_view_toggle_ends_in_the_panel(monkeypatch) -> None:
    panel = widgets.BatchingPanel(FakeServer(), MODEL)
    panel.view.value = "batch timeline"  # nothing run yet: nothing to redraw, nothing said
    assert panel.status.value == widgets.HINT
    panel.last = object()

    def broken() -> None:
        raise ValueError("no axes")

    monkeypatch.setattr(panel, "redraw", broken)
    panel.view.value = "over time"
    assert "redrawing failed: ValueError: no axes" in panel.status.value and "Traceback" in panel.error


def _crowded() -> pd.DataFrame:
    """Two lanes: 60 batches of 5 ms back to back, then 3 of 150 ms (a 4 s run has hundreds of narrow ones)."""
    rows = [("lane 1", i * 5_000_000, i * 5_000_000 + 4_800_000, 16) for i in range(60)]
    rows += [("lane 2", 300_000_000 + i * 151_000_000, 450_000_000 + i * 151_000_000, 7) for i in range(3)]
    return pd.DataFrame(rows, columns=["instance", "start_ns", "end_ns", "size"])


def _label_boxes(ax) -> list:
    renderer = ax.figure.canvas.get_renderer()
    return [t.get_window_extent(renderer) for t in ax.texts]


def _overlaps(boxes) -> int:
    return sum(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])


def test_timeline_labels_only_where_they_fit_and_never_overlap() -> None:
    """Finding: the batch timeline's labels overlapped (a fixed 4 ms minimum, whatever the scale)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    table = _crowded()
    fig = Figure(figsize=(11, 7))  # the panel's figure, its timeline in the lower right
    FigureCanvasAgg(fig)
    old, new = fig.subplots(2, 2)[1]
    batch_timeline(table, old)  # the chart's own rule: labels on every bar of 4 ms or more
    batch_timeline(table, new, label_min_ms=float("inf"))
    fig.tight_layout()
    written = label_batches(new, table)
    assert _overlaps(_label_boxes(old)) > 0  # what the learner saw
    boxes = _label_boxes(new)
    assert written == len(boxes) == 3 and _overlaps(boxes) == 0  # the three wide bars keep theirs
    lane_2 = table[table["instance"] == "lane 2"]
    for box, (start, end) in zip(boxes, lane_2[["start_ns", "end_ns"]].itertuples(index=False)):
        (left, _), (right, _) = new.transData.transform([(start / 1e6, 1), (end / 1e6, 1)])  # origin: 0 ns
        assert left < box.x0 and box.x1 < right  # inside its own bar
    assert label_batches(new, table.iloc[:0]) == 0


# ------------------------------------------------------------------------------ a real server
@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from lab_backends.server.triton_server import TritonServer

    trace_file = Path(tmp_path_factory.mktemp("panel-trace")) / "trace.json"
    with TritonServer(models=[MODEL], trace_file=trace_file, trace_level=("OFF",), trace_log_frequency=1) as started:
        yield started


@pytest.mark.server
def test_panel_runs_from_a_callback_thread_with_a_deadline(server) -> None:
    """The load used to call tritonclient.http (gevent) from the callback's thread: "Cannot switch to a
    different thread", not caught, the status left on "running N in flight..." and the run never recorded.
    """
    panel = widgets.BatchingPanel(server, MODEL, requests=40, duration_s=1.0, concurrency=4, deadline_s=0.05)
    panel.view.value = "batch timeline"
    worker = threading.Thread(target=panel.run)  # not the thread whose client read the config
    worker.start()
    worker.join(60)
    assert "did not finish within 0.05 s" in panel.status.value and panel.runs == []
    assert _wait(lambda: not panel.run_button.disabled, 60), panel.status.value  # the load ended on its own
    panel.deadline_s = widgets.DEADLINE_S
    rows: list = []
    worker = threading.Thread(target=lambda: rows.append(panel.run()))
    worker.start()
    worker.join(90)
    assert rows and rows[0] is not None and rows[0]["errors"] == 0, panel.error
    assert "req/s" in panel.status.value and len(panel.runs) == 1
    assert _images(panel.widget) == [panel.image] and bytes(panel.image.value).startswith(b"\x89PNG")
    timeline = panel._figure.axes[3]
    assert panel.last_batches is not None and _overlaps(_label_boxes(timeline)) == 0


@pytest.mark.server
def test_a_crashed_server_is_named_and_run_again_restarts_it(tmp_path, capsys) -> None:
    """Notebook 03's one re-run, forced: the server dies (finding 14 saw Triton segfault under the panel's
    load); run() says it crashed instead of "connection refused", and run_again() restarts it and runs."""
    from lab_backends.server.triton_server import TritonServer

    with TritonServer(models=[MODEL], trace_file=tmp_path / "trace.json", trace_level=("OFF",),
                      trace_log_frequency=1) as server:
        panel = widgets.BatchingPanel(server, MODEL, requests=40, duration_s=1.0, concurrency=4)
        dead = server.pid
        os.kill(dead, signal.SIGKILL)
        assert _wait(lambda: server.exit_code() is not None, 30)
        assert panel.run() is None
        assert f"tritonserver (pid {dead})" in panel.error and "server.restart()" in panel.error, panel.error
        assert "killed" in panel.status.value, panel.status.value
        row = panel.run_again()
        assert f"re-run after a crash: tritonserver (pid {dead})" in capsys.readouterr().out
        assert row is not None and row["errors"] == 0, panel.error
        assert server.pid != dead and server.is_ready()
