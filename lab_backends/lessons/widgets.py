"""A widget panel to feel dynamic batching: change the batcher, press Run, see what changed.

``BatchingPanel(server, "cost_model")`` shows sliders for ``max_queue_delay``, preferred batch
sizes, the instance count and the client's concurrency. **Run** reloads the live model with those
settings (derived from its current config: an override replaces the whole config), runs a short
closed-loop load bounded by count and time, and redraws one figure in place: every run so far on
the latency-throughput plane, plus the last run's batch sizes, server stages and timeline (requests
over time, or, on a server started with a trace file, which batch ran when: the view toggle).

A bad setting or a config Triton refuses ends as a short red message in the panel, not a traceback;
the full text stays in :attr:`BatchingPanel.error`. So does anything else that goes wrong during a
run (a button callback's traceback would only reach the kernel's log, leaving the status line on
"running..." for good). The load itself runs on a worker thread with a deadline
(``deadline_s``): past it, the panel says what timed out and what to do, and keeps **Run** disabled
until that load has ended (a thread cannot be stopped; a second load beside it would measure both).
Until the first run has drawn something, the figure's place holds a line of text, not an empty
``Image`` (which a browser draws as a broken-image icon).

Deferred imports: ipywidgets (~0.3 s) and matplotlib (~1 s), only when a panel is built or drawn.
"""

from __future__ import annotations

import html
import io
import threading
import traceback
from typing import Any

import pandas as pd
from tritonclient.utils import InferenceServerException

from lab_backends.errors import LabBackendsError, LoadDeadlineError, ModelLoadError
from lab_backends.lessons.deadline import DeadlineRun
from lab_backends.lessons.panel_errors import named, short
from lab_backends.lessons.panel_settings import parse_batch_sizes
from lab_backends.lessons.panel_timeline import NEEDS_TRACE, TimelineWindow, label_batches
from lab_backends.measure import plots
from lab_backends.measure.loadgen import LoadResult, example_inputs, run_closed
from lab_backends.measure.plots_batches import batch_timeline
from lab_backends.server.config_changes import apply_config
from lab_backends.server.crash import crashed
from lab_backends.server.running import RunningServer

#: The first status line: Triton's advice on the order to tune the batcher in.
HINT = (
    "Set the batcher, then press <b>Run</b>. Tune as Triton's guide suggests: dynamic batching on with "
    "delay 0 and no preferred sizes first; then, within your latency budget, a larger max batch size and/or "
    "a delay raised step by step, measuring each step. "
    "Preferred sizes are for specific cases (a backend that runs a few batch sizes best)."
)
#: How long Run waits for its load (warm-up, measured window, statistics) before giving up on it.
#: A run takes seconds (``duration_s`` is a few); a minute means something is stuck.
DEADLINE_S = 60.0


class BatchingPanel:
    """Sliders, a Run button, a status line and a figure redrawn in place."""

    def __init__(
        self,
        server: RunningServer,
        model: str = "cost_model",
        *,
        protocol: str = "grpc",
        requests: int = 300,
        duration_s: float = 4.0,
        concurrency: int = 16,
        deadline_s: float = DEADLINE_S,
    ) -> None:
        import ipywidgets as w

        self.server, self.model, self.protocol = server, model, protocol
        self.requests, self.duration_s, self.deadline_s = requests, duration_s, deadline_s
        self.base = server.model_config(model)
        # Built here, on the cell's thread: inside the load, server.model_config (tritonclient.http,
        # gevent) fails with "Cannot switch to a different thread" on any other thread, such as a
        # button callback's or the load's worker. The batcher settings do not change the inputs.
        self.inputs = example_inputs(self.base)
        batching = self.base.dynamic_batching if self.base.HasField("dynamic_batching") else None
        style = {"description_width": "170px"}
        layout = w.Layout(width="480px")
        self.dynamic = w.Checkbox(value=batching is not None, description="dynamic batching", style=style)
        self.max_queue_delay = w.IntSlider(
            value=batching.max_queue_delay_microseconds if batching else 0,
            min=0,
            max=50_000,
            step=500,
            description="max_queue_delay (µs)",
            style=style,
            layout=layout,
        )
        sizes = list(batching.preferred_batch_size) if batching else []
        if sizes == [self.base.max_batch_size]:
            sizes = []  # what Triton fills in when a config gives none: show the learner's "none"
        self.preferred = w.Text(
            value=", ".join(map(str, sizes)),
            placeholder="empty (default); only for sizes a backend runs best, e.g. 4, 8",
            description="preferred batch sizes",
            style=style,
            layout=layout,
        )
        count = self.base.instance_group[0].count if self.base.instance_group else 1
        self.instances = w.IntSlider(
            value=max(count, 1), min=1, max=4, description="instances", style=style, layout=layout
        )
        self.concurrency = w.IntSlider(
            value=concurrency, min=1, max=64, description="concurrency (client)", style=style, layout=layout
        )
        self.run_button = w.Button(description="Run", button_style="primary", icon="play")
        # The fourth plot: requests over time, or (on a traced server) which lane ran which batch.
        self.view = w.ToggleButtons(
            options=["over time", "batch timeline"],
            value="over time",
            description="last run",
            style={"button_width": "110px"},
        )
        self.timeline = TimelineWindow(server, model)
        self.last_batches: pd.DataFrame | None = None
        self.status = w.HTML(value=HINT)
        self.image = w.Image(format="png", layout=w.Layout(max_width="980px"))
        # The image joins the panel with its first picture: an empty Image is a broken-image icon.
        self.placeholder = w.HTML("<i style='color:#666666'>The figure appears here after the first <b>Run</b>.</i>")
        self.figure_slot = w.Box([self.placeholder])
        self.run_button.on_click(lambda _button: self.run())
        self.view.observe(lambda _change: self._toggle(), names="value")
        self.widget = w.VBox(
            [
                w.HBox(
                    [
                        w.VBox([self.dynamic, self.max_queue_delay, self.preferred]),
                        w.VBox([self.instances, self.concurrency, w.HBox([self.run_button, self.view])]),
                    ]
                ),
                self.status,
                self.figure_slot,
            ]
        )
        self.runs: list[dict[str, Any]] = []
        self.last: LoadResult | None = None
        self.error: str = ""
        self._figure = None
        self._lock = threading.Lock()
        self._stuck = False  # a load past its deadline still runs (guarded by _lock)

    # The panel displays as its widget in a notebook cell.
    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.widget._repr_mimebundle_(**kwargs)

    @property
    def history(self) -> pd.DataFrame:
        """One row per successful Run: the settings and what was measured."""
        return pd.DataFrame(self.runs)

    def override(self) -> dict[str, Any]:
        """The config override for the current settings (checked before anything is reloaded)."""
        override: dict[str, Any] = {
            "instance_group": [{"kind": "KIND_CPU", "count": int(self.instances.value)}],
        }
        if self.dynamic.value:
            batching: dict[str, Any] = {"max_queue_delay_microseconds": int(self.max_queue_delay.value)}
            sizes = parse_batch_sizes(self.preferred.value)
            if sizes:
                batching["preferred_batch_size"] = sizes
            override["dynamic_batching"] = batching
        else:
            override["dynamic_batching"] = None
        return override

    def label(self) -> str:
        if not self.dynamic.value:
            return f"no batching, {self.instances.value} inst"
        pref = f", pref {self.preferred.value}" if self.preferred.value.strip() else ""
        return f"delay {self.max_queue_delay.value} µs{pref}, {self.instances.value} inst"

    def _set_status(self, text: str, error: bool = False) -> None:
        colour = "#b00020" if error else "#1b5e20"
        self.status.value = f"<span style='color:{colour}'>{html.escape(text)}</span>"

    def run(self) -> dict[str, Any] | None:
        """Reconfigure, load, redraw. Returns the new history row, or ``None`` after an error.

        Whatever goes wrong ends in the status line (and :attr:`error`), never only in the kernel's log.
        """
        with self._lock:
            if self._stuck:
                self._set_status("the load that timed out is still running: Run comes back when it ends "
                                 "(server.restart() ends it)", error=True)
                return None
        self.error = ""
        self.run_button.disabled = True
        try:
            return self._run()
        except LoadDeadlineError:
            return None  # said in the panel already, in order with the load's late end (see _load)
        except (LabBackendsError, InferenceServerException, OSError) as caught:
            exc = named(self.server, caught)
            self.error = str(exc)
            refused = isinstance(exc, (InferenceServerException, ModelLoadError))
            prefix = "Triton refused this setting: " if refused else ""
            self._set_status(f"{prefix}{short(exc.reason if isinstance(exc, ModelLoadError) else exc)}", error=True)
            return None
        except Exception as exc:  # noqa: BLE001 - a button callback's traceback is invisible: show it, keep it
            self.error = traceback.format_exc()
            kind = type(exc).__qualname__
            kind = kind if type(exc).__module__ == "builtins" else f"{type(exc).__module__}.{kind}"  # greenlet.error
            self._set_status(f"unexpected {kind} during the run: {short(exc)} (full text in .error)", error=True)
            return None
        finally:
            try:
                if crashed(self.server) is None:  # a dead server has no trace settings to give back
                    self.timeline.close()
            finally:
                with self._lock:
                    self.run_button.disabled = self._stuck

    def run_again(self) -> dict[str, Any] | None:
        """:meth:`run` once more, for a claim that missed; a server that crashed is restarted first, and said."""
        if crashed(self.server) is not None:
            print(f"re-run after a crash: {short(named(self.server, RuntimeError()))}; restarting the server")
            self.server.restart()
        return self.run()

    def _run(self) -> dict[str, Any]:
        override = self.override()
        self._set_status(f"reloading {self.model} ({self.label()})...")
        apply_config(self.server, self.model, override, self.base)
        self._set_status(f"running {self.concurrency.value} in flight (at most {self.deadline_s:g} s)...")
        self.timeline.open()
        result = self._load()
        self.last = result
        if self.timeline.available:
            self._set_status("reading the run's batches from the trace...")
        self.last_batches = self._batches(result)
        row = {"run": len(self.runs) + 1, "config": self.label(), **result.row()}
        self.runs.append(row)
        summary = result.summary
        message = (
            f"{self.label()} @ c={self.concurrency.value}: {summary['throughput_rps']:.0f} req/s, "
            f"p50 {summary['p50_ms']:.1f} ms, p99 {summary['p99_ms']:.1f} ms, "
            f"average batch {row.get('avg_batch', float('nan')):.1f}"
        )
        if summary["errors"]:
            message += f"; {summary['errors']} errors, first: {summary['first_error'][:200]}"
        self.redraw()  # the figure first: a status that shows the numbers means the panel is complete
        self._set_status(message, error=bool(summary["errors"]))
        return row

    def _load(self) -> LoadResult:
        """The closed-loop load on a worker thread; :class:`LoadDeadlineError` past ``deadline_s``."""
        concurrency = int(self.concurrency.value)
        what = (f"the load ({concurrency} in flight, at most {self.requests} requests or {self.duration_s:g} s "
                f"after a short warm-up)")
        advice = ("The server may be stuck or this machine overloaded: check server.is_ready() and the end of "
                  "server.log_text(). Run comes back when that load ends (server.restart() ends it); then press "
                  "Run again.")

        def late_end(load: DeadlineRun) -> None:  # on the worker, under the lock, after the deadline message
            how = f"failed ({type(load.exc).__name__}: {short(load.exc)})" if load.exc is not None else "ended"
            self._set_status(f"{what} {how} {self.deadline_s:g}+ s after it started, too late to count; "
                             "Run is available again.", error=True)
            # Run comes back after the status: whoever sees it enabled (a learner, another thread) reads why.
            self._stuck = False
            self.run_button.disabled = False

        message = f"{what} did not finish within {self.deadline_s:g} s. {advice}"

        def abandon() -> None:  # under the lock: said before any late_end can say more
            self._stuck = True
            self.error = message
            self._set_status(message, error=True)

        load = DeadlineRun(lambda: run_closed(self.server, self.model, concurrency, protocol=self.protocol,
                                        inputs=self.inputs, requests=self.requests, duration_s=self.duration_s),
                     self._lock, late_end)
        if not load.wait(self.deadline_s, abandon):
            raise LoadDeadlineError(message)
        if load.exc is not None:
            raise load.exc
        assert load.result is not None
        return load.result

    def _toggle(self) -> None:
        """The view toggle: redraw the last run (a failure is said in the panel, like Run's)."""
        if self.last is None:
            return
        try:
            self.redraw()
        except Exception as exc:  # noqa: BLE001 - an observer's traceback is invisible too
            self.error = traceback.format_exc()
            self._set_status(f"redrawing failed: {type(exc).__name__}: {short(exc)} (full text in .error)",
                             error=True)

    def _batches(self, result: LoadResult) -> pd.DataFrame | None:
        """The last run's batches (see :mod:`~lab_backends.lessons.panel_timeline`), or ``None`` untraced."""
        if not self.timeline.available:
            return None
        try:
            return self.timeline.batches(len(result.requests) + len(result.warmup))
        except LabBackendsError as exc:
            self.error = str(exc)
            return None

    def redraw(self) -> None:
        """Draw every run so far and the last run's details into the panel's image."""
        from matplotlib.figure import Figure

        if self._figure is None:
            self._figure = Figure(figsize=(11, 7))
        fig = self._figure
        fig.clear()
        axes = fig.subplots(2, 2)
        history = self.history
        if len(history):
            frame = history.assign(config=history["run"].astype(str) + ": " + history["config"])
            for i, (_, row) in enumerate(frame.iterrows()):
                axes[0, 0].scatter(
                    row["throughput_rps"],
                    row["p50_ms"],
                    color=f"C{i % 10}",
                    label=f"{row['config']} c={row['concurrency']}",
                )
            axes[0, 0].set_xlabel("throughput (requests/s)")
            axes[0, 0].set_ylabel("p50 latency (ms)")
            axes[0, 0].set_title("Every run: latency vs throughput")
            axes[0, 0].legend(fontsize="x-small")
            axes[0, 0].grid(alpha=0.3)
            plots.server_breakdown(frame.tail(6), axes[0, 1])
        timeline = self.last is not None and self.view.value == "batch timeline" and self.last_batches is not None
        if self.last is not None:
            plots.batch_histogram(self.last.server, axes[1, 0], label="last run")
            if timeline:
                # Labels are placed below, once the layout is final: only inside bars wide enough for them.
                batch_timeline(self.last_batches, axes[1, 1], label_min_ms=float("inf"),
                               title="Last run: batches on lanes (label = batch size, where it fits)")
            else:
                plots.over_time(self.last, axes[1, 1])
                if self.view.value == "batch timeline":
                    axes[1, 1].set_title(NEEDS_TRACE.split(":")[0], fontsize="small")
        fig.tight_layout()
        if timeline:
            label_batches(axes[1, 1], self.last_batches)
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=80)
        self.image.value = buffer.getvalue()
        self.figure_slot.children = (self.image,)
