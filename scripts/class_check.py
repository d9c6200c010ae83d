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

MODELS = ("cost_model", "echo")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--learners", type=int, default=8)
    parser.add_argument("--notebooks", default="01_rest_and_grpc,10_observability_and_caching")
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
    predicted = class_plan.simulate(class_plan.arrivals(subset, args.learners, 0.0, 0.0),
                                    class_plan.service_times(footprint), replicas=1)
    with TritonServer(models=list(MODELS), target="local") as server:
        latencies, errors = replay(server, [stream] * args.learners)
    ms = sorted(lat * 1000 for _, lat in latencies)
    pct = lambda q: round(ms[min(len(ms) - 1, int(q * len(ms)))], 2)  # noqa: E731
    result = {
        "learners": args.learners, "notebooks": sorted(subset), "models": list(MODELS),
        "requests_sent": len(stream) and sum(c for *_, c in stream) * args.learners,
        "answers": len(ms), "errors": len(errors), "error_sample": errors[:3],
        "measured_p50_ms": pct(0.5), "measured_p99_ms": pct(0.99), "measured_max_ms": round(ms[-1], 2) if ms else None,
        "predicted_p50_ms": predicted.p50_ms, "predicted_p99_ms": predicted.p99_ms, "predicted_max_ms": predicted.max_ms,
        "service_ms": {m: round(s * 1000, 3) for m, s in class_plan.service_times(footprint).items() if m in MODELS},
    }
    out = ROOT / "bench" / "scale" / "check.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
