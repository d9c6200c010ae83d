"""``RequestInspector``: draw a digit, pick a model and a protocol, send it, see what the server did with IT.

The panel is a thin face over :func:`lab_backends.lessons.inspector.core.inspect`: every figure it
shows comes from that call's :class:`Inspection` (the wire bytes, the trace file, the statistics
API, the live config), and a "where each figure came from" list says so under the figures.
Errors (a blank pad, a model that is not loaded, a request the server refuses) end as one short
red line; the full text stays in :attr:`RequestInspector.error` and the panel stays usable, like
:class:`lab_backends.lessons.widgets.BatchingPanel`. An error also takes the previous send's figures
and tables away (nothing stale beside the red line), and until a send succeeds the two picture slots
hold a line of text, never an empty ``Image`` (which a browser draws as a broken-image icon).

Deferred import: ipywidgets (~0.3 s), only when a view is built in a notebook.
"""

from __future__ import annotations

import html
import json
import traceback
from typing import Any

import numpy as np
from tritonclient.utils import InferenceServerException

from lab_backends import rest
from lab_backends.errors import LabBackendsError

from . import core, figures
from .evidence import ensemble_batch_note, shared_text, window_table
from .exchange import PROTOCOLS, fit_input, live_config
from .pad import DigitPad

#: Models offered by default: every digits model whose input a drawing fills.
MODELS = ("digits_ensemble", "digits_bls", "digits_ensemble_c", "digits_onnx", "digits_torch",
          "digits_logreg", "digits_forest")


#: What the picture slots say before the first send, and after a failed one.
WAITING = {
    "answer": "The answer chart (10 class scores) appears here after <b>Send 1</b>.",
    "waterfall": "The waterfall of your request, read from the server's trace file, appears here after a send.",
}
FAILED = "No figures: the last send failed (the red line says why); the previous send's figures were taken away."


def _short(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return " ".join(lines[:2])[:400]


class RequestInspector:
    """The panel. ``RequestInspector(server)`` offers the loaded digits models; ``.send()`` is the Send 1 button."""

    def __init__(self, server: Any, models: tuple[str, ...] | None = None, model: str | None = None,
                 protocol: str = "gRPC") -> None:
        import ipywidgets as w

        self.server = server
        offered = list(models) if models else self.fitting_models() or list(MODELS)
        self.pad = DigitPad()
        self.model = w.Dropdown(options=offered, value=model if model in offered else offered[0],
                                description="model")
        self.protocol = w.ToggleButtons(options=list(PROTOCOLS), value=protocol, description="protocol")
        self.burst = w.IntSlider(value=8, min=2, max=core.MAX_BURST, description="burst of N")
        self.send_button = w.Button(description="Send 1", button_style="primary", icon="paper-plane")
        self.burst_button = w.Button(description="Send burst of N", icon="forward")
        self.send_button.on_click(lambda _b: self.send(1))
        self.burst_button.on_click(lambda _b: self.send(int(self.burst.value)))
        self.status = w.HTML("Draw a digit (or pick one), choose a model and a protocol, press <b>Send 1</b>.")
        # The images join the panel only once they hold a picture: an empty Image is a broken icon.
        self.answer = w.Image(format="png", layout=w.Layout(max_width="420px"))
        self.answer.add_class("lab-inspector-answer")
        self.answer_slot = w.Box([self._note(WAITING["answer"], "336px")])
        self.wire = w.HTML()
        self.wire.add_class("lab-inspector-wire")
        self.waterfall = w.Image(format="png", layout=w.Layout(max_width="860px"))
        self.waterfall.add_class("lab-inspector-waterfall")
        self.waterfall_slot = w.Box([self._note(WAITING["waterfall"])])
        self.details = w.HTML()
        self.details.add_class("lab-inspector-details")
        controls = w.VBox([self.model, self.protocol, self.burst, w.HBox([self.send_button, self.burst_button])])
        self.widget = w.VBox([w.HBox([self.pad.widget, controls, self.answer_slot]), self.status,
                              self.wire, self.waterfall_slot, self.details])
        self.widget.add_class("lab-request-inspector")
        self.error = ""
        self.last: core.Inspection | None = None
        self.history: list[core.Inspection] = []

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.widget._repr_mimebundle_(**kwargs)

    def fitting_models(self) -> list[str]:
        """Every READY model a drawing fills and whose answer holds class scores (digits models first).

        The repository index is a restricted API (the admin key is sent); each candidate's live
        config decides, through the same :func:`~.wire.fit_input` that builds the request.
        """
        status, body = rest.request(f"http://{self.server.http_url}/v2/repository/index", method="POST",
                                    body=b"{}", headers=self.server.admin_headers, timeout=10)
        ready = sorted(e["name"] for e in json.loads(body) if e.get("state") == "READY") if status == 200 else []
        fitting = []
        for name in ready:
            try:
                config = live_config(self.server, name)
                fit_input(config, np.zeros((8, 8), np.uint8))
            except LabBackendsError:
                continue
            outputs = {o.name for o in config.output}
            if outputs & {"LOGITS", "PROBABILITIES"} or {"LABELS", "PROBS"} <= outputs:  # what class_scores reads
                fitting.append(name)
        return sorted(fitting, key=lambda m: (MODELS.index(m) if m in MODELS else len(MODELS), m))

    def _set_status(self, text: str, error: bool = False) -> None:
        colour = "#b00020" if error else "#1b5e20"
        self.status.value = f"<span style='color:{colour}'>{html.escape(text)}</span>"

    @staticmethod
    def _note(text: str, width: str = "") -> Any:
        import ipywidgets as w

        note = w.HTML(f"<i style='color:#666666'>{text}</i>", layout=w.Layout(width=width or "auto"))
        note.add_class("lab-inspector-placeholder")
        return note

    def clear(self, why: str = FAILED) -> None:
        """Take the last figures, wire view and tables away; the picture slots say ``why`` instead."""
        self.answer_slot.children = (self._note(why, "336px"),)
        self.waterfall_slot.children = (self._note(why),)
        self.answer.value = self.waterfall.value = b""
        self.wire.value = self.details.value = ""

    def send(self, burst: int = 1) -> core.Inspection | None:
        """Send the pad's digit (``burst`` copies at once) and show what the server did with it."""
        self.error = ""
        self.send_button.disabled = self.burst_button.disabled = True
        try:
            self._set_status(f"sending to {self.model.value} over {self.protocol.value}...")
            result = core.inspect(self.server, self.model.value, self.pad.image, self.protocol.value, burst=burst)
        except (LabBackendsError, InferenceServerException, OSError) as exc:
            self.error = str(exc)
            self.clear()
            self._set_status(_short(exc), error=True)
            return None
        except Exception as exc:  # noqa: BLE001 - a button callback's traceback is invisible: show it, keep it
            self.error = traceback.format_exc()
            self.clear()
            self._set_status(f"unexpected {type(exc).__name__}: {_short(exc)} (full text in .error)", error=True)
            return None
        finally:
            self.send_button.disabled = self.burst_button.disabled = False
        self.last = result
        self.history.append(result)
        try:
            self.show(result)  # the figures first: a status that says "answered" means the panel is complete
        except Exception as exc:  # noqa: BLE001 - as above: a figure that cannot be drawn is said, not lost
            self.error = traceback.format_exc()
            self.clear()
            self._set_status(f"the answer came back, but drawing it failed: {type(exc).__name__}: {_short(exc)} "
                             "(full text in .error)", error=True)
            return result
        self._set_status(result.summary())
        return result

    def show(self, result: core.Inspection) -> None:
        """Fill the answer chart, the wire view, the waterfall and the tables from ``result``."""
        self.answer.value = figures.answer_png(result)
        self.waterfall.value = figures.waterfall_png(result)
        self.answer_slot.children = (self.answer,)
        self.waterfall_slot.children = (self.waterfall,)
        self.wire.value = ("<b>On the wire</b> (" + html.escape(result.sources["wire"]) + ")<pre style='max-height:"
                           "260px;overflow:auto;font-size:11px;border:1px solid #ddd;padding:4px'>"
                           + html.escape(result.sent.text) + "</pre>")
        execs = result.executions[["model", "instance", "batch_size", "shared_with", "compute_ms"]].round(3)
        execs["shared_with"] = [shared_text(ids, limit=4) for ids in execs["shared_with"]]
        sources = "".join(f"<li><b>{html.escape(k)}</b>: {html.escape(v)}</li>" for k, v in result.sources.items())
        ensemble = ""
        if result.platform == "ensemble":  # its own statistics count one execution per request: say why
            note = ensemble_batch_note(result.model, result.window, result.executions)
            ensemble = f"<p class='lab-inspector-ensemble-note' style='max-width:860px'>{html.escape(note)}</p>"
        self.details.value = (
            f"<b>Batch</b> (largest: {result.batch_size}) — executions that worked on this request:"
            + execs.to_html(index=False) + f"<b>Instance</b>: {html.escape(result.instance)}<br>"
            + f"<b>Statistics of {html.escape(result.model)} over this send</b>"
            + window_table(result.window).to_html(index=False) + ensemble
            + f"<b>Where each figure came from</b><ul>{sources}</ul>"
        )
