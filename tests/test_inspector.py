"""lab_backends.lessons.inspector: its pieces on outputs recorded from a real server, then the whole
panel against a real server, one drawn digit per protocol, checked against the trace file and the
statistics API for that request id."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
import pytest

from lab_backends.client.protocol import HEADER_LENGTH, decode_response
from lab_backends.errors import ProtocolError
from lab_backends.lessons.inspector import SEVEN, RequestInspector, evidence, stroke
from lab_backends.lessons.inspector.exchange import class_scores
from lab_backends.lessons.inspector.pad import cell_at, paint
from lab_backends.measure import stats, trace

DATA = Path(__file__).resolve().parent / "data" / "inspector"


def _json(name: str):
    return json.loads((DATA / name).read_text())


@pytest.fixture(scope="module")
def recorded():
    return trace.TraceLog.from_records(_json("trace_records.json")), _json("meta.json")


# ------------------------------------------------------------------------------ recorded outputs
def test_pad_maps_mouse_points_to_cells_and_paints_a_soft_brush() -> None:
    assert (
        cell_at(0, 0) == (0, 0) and cell_at(191.9, 30) == (1, 7) and cell_at(192, 0) is None and cell_at(-1, 5) is None
    )
    image = paint(np.zeros((8, 8), np.uint8), 0, 0)
    assert image[0, 0] == 16 and image[0, 1] == image[1, 0] == 8 and image.sum() == 32
    assert stroke(SEVEN).max() == 16 and stroke(SEVEN).tolist() == _json("meta.json")["image"]


def test_pad_widget_paints_from_mouse_events_and_clears() -> None:
    from lab_backends.lessons.inspector.pad import DigitPad

    pad = DigitPad(examples=3)
    pad._move(30, 30)  # moving without a pressed button draws nothing
    assert not pad.image.any()
    pad._down(30, 30)
    pad._move(60, 30)
    pad._up(60, 30)
    pad._move(150, 150)
    assert pad.image[1, 1] == pad.image[1, 2] == 16 and pad.image[6, 6] == 0
    pad.picker.value = 2
    assert np.array_equal(pad.image, pad.examples[2])
    pad.clear()
    assert not pad.image.any() and pad.picker.value == -1


def test_batch_of_the_recorded_burst_comes_from_shared_compute_stamps(recorded) -> None:
    log, meta = recorded
    execs = evidence.executions(log, meta["burst"])
    assert list(execs["model"]) == ["digits_preprocess", "digits_onnx", "digits_postprocess"]
    assert evidence.learner_batch(execs) == meta["largest_batch"] > 1
    shared = set().union(*execs["shared_with"])
    assert shared and shared <= set(meta["copies"])
    # The copies really carry the same stamps as the learner's child in that execution.
    compute = evidence.compute_stamps(log)
    first = execs.iloc[0]
    same = compute[(compute["model"] == first["model"]) & (compute["COMPUTE_START"] == first["compute_start_ns"])]
    assert len(same) == first["batch_size"]


def test_alone_requests_ran_in_batches_of_one(recorded) -> None:
    log, _ = recorded
    for rid in ("one-json", "one-binary", "one-grpc"):
        execs = evidence.executions(log, rid)
        assert list(execs["batch_size"]) == [1] and execs["shared_with"].iloc[0] == []
        assert evidence.stages_in_order(log, rid)
        assert 0 < evidence.stage_sum_ms(log, rid) <= float(log.request(rid)["total_ms"]) + 1e-6


def test_stages_out_of_order_are_caught(recorded) -> None:
    log, _ = recorded
    root = log.request("one-grpc")
    broken = log.stages.copy()
    mask = (broken["trace_id"] == int(root["trace_id"])) & (broken["stage"] == "send")
    broken.loc[mask, "start_ns"] = int(log.stages["start_ns"].min()) - 1
    assert not evidence.stages_in_order(trace.TraceLog(log.requests, broken, log.stamps), "one-grpc")


def test_statistics_delta_of_the_recorded_burst() -> None:
    window = stats.window(_json("stats_before.json"), _json("stats_after.json"), "digits_ensemble")
    assert window.requests == 6 and window.failures == 0
    table = evidence.window_table(window)
    assert table.set_index("statistic").loc["successful requests", "delta over this send"] == 6


def test_wire_bytes_json_vs_binary_and_scores() -> None:
    wire = _json("wire.json")
    json_body = base64.b64decode(wire["json"]["request_body"])
    binary_body = base64.b64decode(wire["binary"]["request_body"])
    header = int(wire["binary"]["request_headers"][HEADER_LENGTH])
    assert len(binary_body) - header == 64 * 4  # 64 float32 pixels as raw bytes after the JSON header
    # JSON carries the same 64 numbers as text: its size follows their digits, not the dtype.
    values = json.loads(json_body)["inputs"][0]["data"]
    assert len(values) == 64 and json.dumps(values, separators=(",", ":")).encode() in json_body
    _, outputs = decode_response(base64.b64decode(wire["binary"]["response_body"]), wire["binary"]["response_headers"])
    scores, predicted, source = class_scores(outputs)
    assert predicted == 7 and abs(scores.sum() - 1) < 1e-6 and "LOGITS" in source
    from tritonclient.grpc import service_pb2

    response = service_pb2.ModelInferResponse.FromString(base64.b64decode(wire["grpc"]["response"]))
    assert response.id == "one-grpc" and len(response.raw_output_contents[0]) == 40


def test_top3_answer_leaves_the_other_classes_unknown() -> None:
    scores, predicted, _ = class_scores(
        {"LABELS": np.array([[b"7", b"1", b"9"]], object), "PROBS": np.array([[0.9, 0.06, 0.01]], np.float32)}
    )
    assert predicted == 7 and np.isnan(scores[0]) and scores[1] == pytest.approx(0.06)
    with pytest.raises(ProtocolError, match="no class scores"):
        class_scores({"OTHER": np.zeros(3)})


# ------------------------------------------------------------------------------ the panel, no server
def _recorded_inspection(recorded):
    """An :class:`Inspection` of the recorded ensemble burst (a real server's trace and statistics)."""
    from lab_backends.lessons.inspector import Inspection
    from lab_backends.lessons.inspector.exchange import InputFit, Sent

    log, meta = recorded
    execs = evidence.executions(log, meta["burst"])
    execs["instance"] = "digits_onnx_0_0"
    scores = np.full(10, np.nan)
    scores[[7, 1, 9]] = [0.9, 0.06, 0.01]
    return Inspection(
        "digits_ensemble", "gRPC", meta["burst"], meta["copies"],
        InputFit("IMAGE", np.zeros((1, 8, 8), np.uint8), "the raw drawing"),
        Sent("gRPC", meta["burst"], "ModelInferRequest {...}", 120, 200, 2.0, {}), scores, 7, log, execs,
        stats.window(_json("stats_before.json"), _json("stats_after.json"), "digits_ensemble"),
        "none: an ensemble runs no code of its own", {"wire": "recorded"}, "ensemble",
    )


def _images(widget) -> list:
    """Every ``ipywidgets.Image`` the panel's widget tree holds (what a browser would draw)."""
    import ipywidgets as w

    found = [widget] if isinstance(widget, w.Image) else []
    for child in getattr(widget, "children", ()):
        found += _images(child)
    return found


def _texts(widget) -> str:
    import ipywidgets as w

    own = widget.value if isinstance(widget, w.HTML) else ""
    return own + "".join(_texts(child) for child in getattr(widget, "children", ()))


def test_no_image_before_the_first_send_only_a_line_saying_what_comes() -> None:
    """Finding: two broken-image icons before the first send (an empty Image draws as one)."""
    panel = RequestInspector(None, models=("digits_ensemble",))
    assert _images(panel.widget) == []
    assert "answer chart" in _texts(panel.widget) and "waterfall of your request" in _texts(panel.widget)


def test_an_error_takes_the_previous_figures_and_tables_away(recorded) -> None:
    """Finding: after a failed send (blank pad) the old chart and waterfall stayed under the red line."""
    panel = RequestInspector(None, models=("digits_ensemble",))
    panel.show(_recorded_inspection(recorded))
    shown = _images(panel.widget)
    assert shown == [panel.answer, panel.waterfall] and all(bytes(i.value).startswith(b"\x89PNG") for i in shown)
    assert "Where each figure came from" in panel.details.value and panel.wire.value
    assert panel.send() is None  # the pad is blank: refused before any server is asked
    assert "blank" in panel.status.value and "#b00020" in panel.status.value
    assert _images(panel.widget) == [] and panel.details.value == "" and panel.wire.value == ""
    assert not panel.answer.value and not panel.waterfall.value
    assert "last send failed" in _texts(panel.widget)
    panel.show(_recorded_inspection(recorded))  # the next good answer brings the figures back
    assert _images(panel.widget) == [panel.answer, panel.waterfall]


def test_shared_with_says_how_many_it_leaves_out(recorded) -> None:
    """Finding: the "shared with" list was cut at 6 without a word."""
    assert evidence.shared_text([]) == "no other request"
    ids = [f"r-copy{i}" for i in range(1, 32)]
    assert evidence.shared_text(ids) == "r-copy1, r-copy2, r-copy3, r-copy4, r-copy5, r-copy6 … and 25 more"
    assert evidence.shared_text(ids[:6]) == ", ".join(ids[:6])  # nothing left out, nothing said
    result = _recorded_inspection(recorded)
    result.executions["shared_with"] = [ids] * len(result.executions)
    assert "(shared with r-copy1, " in result.summary() and "… and 25 more)" in result.summary()
    panel = RequestInspector(None, models=("digits_ensemble",))
    panel.show(result)
    assert "r-copy1, r-copy2, r-copy3, r-copy4 … and 27 more" in panel.details.value


def test_an_ensembles_average_batch_of_one_is_explained(recorded) -> None:
    """Finding: "average batch 1.0" beside steps that ran batches, unexplained.

    Recorded from a real server: the ensemble's own statistics counted 6 executions for 6 requests
    while its steps ran them in one batch of 6 (core r24.10 ensemble_scheduler.cc:94-98).
    """
    result = _recorded_inspection(recorded)
    assert result.window.requests == result.window.executions == 6 and result.window.avg_batch == 1.0
    assert result.batch_size == 6
    note = evidence.ensemble_batch_note(result.model, result.window, result.executions)
    assert "average batch is 1.0" in note and "6 executions for 6 requests" in note
    assert "digits_preprocess 6" in note and "ensemble_scheduler.cc:94-98" in note
    panel = RequestInspector(None, models=("digits_ensemble",))
    panel.show(result)
    assert "lab-inspector-ensemble-note" in panel.details.value
    result.platform = "onnxruntime_onnx"  # a model with its own scheduler: its statistics need no note
    panel.show(result)
    assert "lab-inspector-ensemble-note" not in panel.details.value


# ------------------------------------------------------------------------------ a real server
MODELS = ["digits_preprocess", "digits_onnx", "digits_postprocess", "digits_ensemble"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from lab_backends.server.triton_server import TritonServer

    trace_file = tmp_path_factory.mktemp("inspector-trace") / "trace.json"
    with TritonServer(
        models=MODELS, trace_file=trace_file, trace_level=("TIMESTAMPS",), trace_rate=1, trace_log_frequency=1
    ) as started:
        yield started


@pytest.mark.server
@pytest.mark.parametrize("protocol", ["REST JSON", "REST binary", "gRPC"])
def test_panel_figures_match_the_trace_file_and_statistics(server, protocol) -> None:
    panel = RequestInspector(
        server, models=("digits_ensemble", "digits_onnx"), model="digits_ensemble", protocol=protocol
    )
    panel.pad.set_image(stroke(SEVEN))
    before = stats.settled_statistics(server, "digits_ensemble")
    result = panel.send(3)
    assert result is not None, panel.error
    after = stats.settled_statistics(server, "digits_ensemble")
    # Independent read of the same trace file, for that request id.
    log = trace.read_trace(trace.trace_path(server), request_ids=[result.request_id])
    root = log.request(result.request_id)
    assert float(result.root["total_ms"]) == pytest.approx(float(root["total_ms"]))
    assert root["protocol"] == ("grpc" if protocol == "gRPC" else "http")
    assert sorted(log.children(int(root["trace_id"]))["model"]) == sorted(MODELS[:3])
    assert result.batch_size == evidence.learner_batch(evidence.executions(log, result.request_id))
    assert result.window.requests == stats.window(before, after, "digits_ensemble").requests == 3
    assert result.predicted == 7 and "LABELS" in result.sent.text
    assert panel.answer.value and panel.waterfall.value and "On the wire" in panel.wire.value
    assert "Where each figure came from" in panel.details.value
    # The ensemble's own statistics: one execution per request, whatever its steps batched.
    assert result.window.executions == result.window.requests and "lab-inspector-ensemble-note" in panel.details.value


@pytest.mark.server
def test_errors_end_in_the_panel_and_it_stays_usable(server) -> None:
    offered = list(RequestInspector(server).model.options)
    assert offered == ["digits_ensemble", "digits_onnx"]  # from the server: what is loaded and fits
    # (digits_preprocess takes the drawing but answers pixels, digits_postprocess takes LOGITS: not offered)
    panel = RequestInspector(server, models=("digits_ensemble", "digits_torch"))
    assert panel.send() is None and "blank" in panel.status.value and "blank" in panel.error
    panel.pad.set_image(stroke(SEVEN))
    panel.model.value = "digits_torch"  # in the repository, not loaded on this server
    assert panel.send() is None and "digits_torch" in panel.error and not panel.send_button.disabled
    panel.model.value = "digits_ensemble"
    assert panel.send() is not None and panel.error == "" and len(_images(panel.widget)) == 2
    panel.model.value = "digits_torch"
    assert panel.send() is None and _images(panel.widget) == [] and panel.details.value == ""


@pytest.mark.server
def test_send_works_from_a_widget_callback_thread(server) -> None:
    """ipykernel may run button callbacks on another thread than the cells: no gevent client there."""
    import threading

    server.model_config("digits_ensemble")  # tritonclient.http (gevent) now lives on this thread
    panel = RequestInspector(server, models=("digits_ensemble",), protocol="REST binary")
    panel.pad.set_image(stroke(SEVEN))
    results: list = []
    worker = threading.Thread(target=lambda: results.append(panel.send()))
    worker.start()
    worker.join(60)
    assert results and results[0] is not None, panel.error


def test_instance_names_are_tritons_own() -> None:
    """``<group>_<k>``, the group defaulting to ``<model>_<g>``.

    Core at r24.10: ``src/model_config_utils.cc:851``, ``src/backend_model.cc:594``.
    """

    from google.protobuf import text_format

    from lab_backends.server.repository import ModelConfig

    served = text_format.Parse('name: "digits_onnx" instance_group [{name: "digits_onnx_0" count: 1 kind: KIND_CPU}]',
                               ModelConfig())
    assert evidence.instance_name(served) == "digits_onnx_0_0"
    assert evidence.instance_of(served).startswith("digits_onnx_0_0 (KIND_CPU)")
    named = text_format.Parse('name: "m" instance_group [{name: "fast" count: 1}]', ModelConfig())
    assert evidence.instance_name(named) == "fast_0"
    two = text_format.Parse('name: "m" instance_group [{count: 2}]', ModelConfig())
    assert evidence.instance_name(two) == "1 of 2 (not in the trace)"
