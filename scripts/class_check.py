"""Check the class simulator against one measured point on this machine.

    PYTHONPATH=$PWD .venv/bin/python scripts/class_check.py [--learners 8] [--notebooks 01_rest_and_grpc,...]

N simulated learners replay, all at once, the request streams recorded for the chosen notebooks
(bench/scale/footprint.json, models cost_model and echo) against ONE embedded Triton; the measured
client latencies are compared with what lab_backends.measure.class_plan predicts for the same
streams on one replica. Writes bench/scale/check.json. The machine is shared (2 cores, other
people's work): expect noise, compare the order of magnitude and the direction.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from lab_backends.measure import class_plan  # noqa: E402
from lab_backends.measure.replay import replay  # noqa: E402
from lab_backends.server.triton_server import TritonServer  # noqa: E402

MODELS = ("cost_model", "echo", "digits_onnx", "digits_torch")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--learners", type=int, default=8)
    parser.add_argument("--notebooks", default="01_rest_and_grpc,05_wrapping_frameworks")
    args = parser.parse_args()
    footprint = class_plan.load_footprint()
    subset = {}
    for name in args.notebooks.split(","):
        nb = dict(footprint[name])
        nb["stream"] = [row for row in nb["stream"] if row[1] in MODELS]
        subset[name] = nb
    # The learners' streams: notebooks one after the other, all learners starting together.
    stream, offset = [], 0.0
    for name in sorted(subset):
        stream += [(offset + row[0], row[1], row[2]) for row in subset[name]["stream"]]
        offset += subset[name]["wall_s"]
    costs = class_plan.execution_costs(footprint)
    predicted = class_plan.simulate(class_plan.arrivals(subset, args.learners, 0.0, 0.0), costs, replicas=1)
    alone = class_plan.simulate(class_plan.arrivals(subset, 1, 0.0, 0.0), costs, replicas=1)
    with TritonServer(models=list(MODELS), target="local") as server:
        latencies, errors = replay(server, [stream] * args.learners)
        one, _ = replay(server, [stream])  # the same server with one learner: the baseline
    ms = sorted(lat * 1000 for _, lat, _ in latencies)
    # The simulator once more, fed the arrival times the client really achieved.
    actual = class_plan.simulate(sorted((sent, 0, model) for model, _, sent in latencies), costs, replicas=1)
    pct = lambda q: round(ms[min(len(ms) - 1, int(q * len(ms)))], 2)  # noqa: E731
    result = {
        "learners": args.learners,
        "notebooks": sorted(subset),
        "models": list(MODELS),
        "requests_sent": len(stream) and sum(c for *_, c in stream) * args.learners,
        "answers": len(ms),
        "errors": len(errors),
        "error_sample": errors[:3],
        "measured_one_learner_p99_ms": round(sorted(lat * 1000 for _, lat, _ in one)[int(0.99 * len(one))], 2)
        if one
        else None,
        "measured_p50_ms": pct(0.5),
        "measured_p99_ms": pct(0.99),
        "measured_max_ms": round(ms[-1], 2) if ms else None,
        "predicted_p50_ms": predicted.p50_ms,
        "predicted_p99_ms": predicted.p99_ms,
        "predicted_max_ms": predicted.max_ms,
        "predicted_one_learner_p99_ms": alone.p99_ms,
        "predicted_from_actual_sends_p50_ms": actual.p50_ms,
        "predicted_from_actual_sends_p99_ms": actual.p99_ms,
        "send_span_s": round(max(s for *_, s in latencies) - min(s for *_, s in latencies), 2),
        "recorded_span_s": round(max(t for t, *_ in stream) - min(t for t, *_ in stream), 2),
        "costs_ms": {
            m: [round(c.fixed_s * 1000, 3), round(c.per_item_s * 1000, 3), c.max_batch]
            for m, c in costs.items()
            if m in MODELS
        },
    }
    out = ROOT / "bench" / "scale" / "check.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
