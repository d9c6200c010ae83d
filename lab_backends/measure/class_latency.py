"""How the shared server of a one-machine class answers 1, 3, 6 learners, measured beside plan-class.

``lab-backends class measure`` starts one embedded Triton restricted like the class's (the models
the replayed notebooks use), and for each learner count N replays, from N threads each with its own
gRPC connection, the requests a notebook sent (``bench/scale/footprint.json``, recorded pace, all
learners starting together: the worst case of a class pressing Run All at once). The latency of
every answer is measured at the client; :func:`class_plan.simulate` predicts the server-side
latency of the same arrivals on one replica. Both go to ``bench/scale/one_machine.json``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from lab_backends.measure import class_plan
from lab_backends.measure.replay import replay
from lab_backends.server.admin import CLASS_RESTRICTED
from lab_backends.server.triton_server import TritonServer


def learner_stream(footprint: dict, notebooks: Sequence[str]) -> tuple[dict, list[tuple[float, str, int]]]:
    subset, stream, offset = {}, [], 0.0
    for name in notebooks:
        nb = dict(footprint[name])
        subset[name] = nb
        stream += [(offset + row[0], row[1], row[2]) for row in nb["stream"]]
        offset += nb["wall_s"]
    return subset, stream


def percentiles(values_ms: list[float]) -> dict[str, float]:
    if not values_ms:
        return {"p50_ms": float("nan"), "p99_ms": float("nan"), "max_ms": float("nan")}
    arr = np.asarray(values_ms)
    return {"p50_ms": float(np.percentile(arr, 50)), "p99_ms": float(np.percentile(arr, 99)),
            "max_ms": float(arr.max())}


#: Replays N learners' streams another way (each in a class sandbox: ``classroom/sandboxed_replay.py``):
#: (server, stream, N) -> (answers, errors), as :func:`replay` returns them.
Replayer = Callable[[Any, list, int], tuple[list[tuple[str, float, float]], list[str]]]


def measure(learner_counts: Sequence[int], notebooks: Sequence[str], out: Path | None = None,
            sandboxed: Replayer | None = None) -> dict[str, Any]:
    """Measured and predicted latency for each learner count; written to ``out`` as JSON.

    With ``sandboxed``, each count is also replayed that way right after the plain replay, on the same
    server in the same run, so the two columns compare (``class measure --sandboxed``).
    """
    footprint = class_plan.load_footprint()
    subset, stream = learner_stream(footprint, notebooks)
    models = sorted({m for _, m, _ in stream})
    costs = class_plan.execution_costs(footprint)
    rows = []
    with TritonServer(models=models, target="local", restricted_apis=CLASS_RESTRICTED) as server:
        replay(server, [stream[:5]])  # warm the connection path once; not measured
        for n in learner_counts:
            started = time.monotonic()
            latencies, errors = replay(server, [stream] * n)
            predicted = class_plan.simulate(class_plan.arrivals(subset, n, 0.0, 0.0), costs, replicas=1)
            rows.append({"learners": n, "requests": len(latencies), "errors": len(errors),
                         "wall_s": round(time.monotonic() - started, 1),
                         "measured": percentiles([lat * 1000 for _, lat, _ in latencies]),
                         "predicted": {"p50_ms": predicted.p50_ms, "p99_ms": predicted.p99_ms,
                                       "max_ms": predicted.max_ms}})
            if sandboxed is not None:
                boxed, boxed_errors = sandboxed(server, stream, n)
                rows[-1]["sandboxed"] = {**percentiles([lat * 1000 for _, lat, _ in boxed]),
                                         "requests": len(boxed), "errors": len(boxed_errors)}
    result = {"notebooks": list(notebooks), "models": models, "rows": rows,
              "note": "measured: client side (gRPC, all learners start together); predicted: plan-class's "
                      "simulator, server side (queue + execution), same arrivals, one replica"}
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1))
    return result


def report(result: dict[str, Any]) -> str:
    boxed = any("sandboxed" in row for row in result["rows"])
    extra = (" sandboxed p50 / p99 ms (requests, errors) |", "---|") if boxed else ("", "")
    lines = [f"notebooks {', '.join(result['notebooks'])} replayed (models {', '.join(result['models'])})",
             "| learners | requests | errors | measured p50 / p99 ms | plan-class p50 / p99 ms |" + extra[0],
             "|---|---|---|---|---|" + extra[1]]
    for row in result["rows"]:
        m, p, b = row["measured"], row["predicted"], row.get("sandboxed")
        tail = f" {b['p50_ms']:.1f} / {b['p99_ms']:.1f} ({b['requests']}, {b['errors']}) |" if b else ""
        lines.append(f"| {row['learners']} | {row['requests']} | {row['errors']} "
                     f"| {m['p50_ms']:.1f} / {m['p99_ms']:.1f} | {p['p50_ms']:.1f} / {p['p99_ms']:.1f} |" + tail)
    return "\n".join(lines)
