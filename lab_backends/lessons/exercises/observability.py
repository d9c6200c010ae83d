"""Notebook 10's exercise (``metrics_window``): what happened between two scrapes of the metrics page.

A scraper sees only cumulative counters; what happened in a window is the difference of two
scrapes, and each counter counts something else. The checker loads ``cost_model`` afresh with the
response cache on (unless it is so already), sends a few requests, scrapes, sends :data:`WINDOW`
one at a time (fresh and repeated inputs, 1 to 4 rows each), waits until the counters show all of
them, scrapes again and hands both pages to the learner's ``window(before, after, model)``.

Why each number is what it is, in Triton 2.51 (core ``src/infer_stats.cc`` at r24.10):

* ``nv_inference_request_success`` counts requests, cache hits included (L120, L175);
* ``nv_inference_count`` counts inferences, the rows of each executed request: ``batch_size`` per
  request (L121), nothing on a cache hit (L174);
* ``nv_inference_exec_count`` counts model executions (L431); a hit never reaches the model: the
  dynamic batcher answers it from the cache before it queues (``src/dynamic_batch_scheduler.cc``
  L216-235);
* ``nv_cache_num_hits_per_model`` counts hits (L181). It exists only when the model was loaded
  afresh with the cache on, not reloaded (:mod:`lab_backends.lessons.cache_metrics`): hence the
  unload, then the load.

Every input sent as "fresh" is new random data (an unseeded generator): the cache outlives an
unload (its key is model name, version and input bytes, ``src/cache_manager.cc`` L319-350), so a
repeated check must not find last time's inputs there. Requests go one at a time, so each miss is
one execution and every number is fixed by construction, whatever the machine's speed.

The learner's server is used when it has a response cache (the notebook's has), and given back
with the config it had. Otherwise (the audit's servers, a class server) the checker starts one of
its own, once per process, and stops it when the process exits: every check after the first
costs a few requests, not a server start and a model load.
"""

from __future__ import annotations

import atexit
import contextlib
import math
from typing import Any, Callable

import numpy as np

from lab_backends.client.infer import infer
from lab_backends.errors import ExerciseError
from lab_backends.lessons import cache_metrics
from lab_backends.lessons.cache_metrics import COUNTERS
from lab_backends.lessons.exercises.registry import exercise
from lab_backends.measure import stats
from lab_backends.server.running import RunningServer
from lab_backends.server.triton_server import TritonServer

MODEL = "cost_model"
#: Sent before the first scrape: two misses and a hit, so that no counter starts the window at 0.
BEFORE = (("a", 2), ("a", 2), ("b", 1))
#: The window, in order: (input, rows); a letter seen before is a repeat (a cache hit).
WINDOW = (("c", 4), ("c", 4), ("c", 4), ("d", 1), ("d", 1), ("e", 3), ("c", 4))
KEYS = ("requests", "cache_hits", "executions", "avg_batch")
#: The checker's own server (one per process), for answers checked without a server that has a cache.
_OWN: list[TritonServer] = []


def expected_window(sends: tuple[tuple[str, int], ...] = WINDOW,
                    seen: frozenset[str] = frozenset(k for k, _ in BEFORE)) -> dict[str, float]:
    """The counters' growth over ``sends`` sent one at a time: a letter already sent is a cache hit."""
    requests = hits = executions = inferences = 0
    cached = set(seen)
    for key, rows in sends:
        requests += 1
        if key in cached:
            hits += 1
        else:
            cached.add(key)
            executions += 1
            inferences += rows
    return {"requests": requests, "cache_hits": hits, "executions": executions, "inferences": inferences,
            "avg_batch": inferences / executions}


@exercise(
    "metrics_window",
    notebook="10_observability_and_caching",
    task=(
        "Write window(before, after, model) that takes two pages of Prometheus text scraped from the metrics "
        "endpoint (before and after a window) and returns a dict for that model over the window: 'requests' "
        "(successful requests, cache hits included), 'cache_hits', 'executions' (times the model ran) and "
        "'avg_batch' (inferences per execution). The checker loads cost_model afresh with the response cache on, "
        "sends a few requests, scrapes, sends 7 more one at a time (new and repeated inputs of 1 to 4 rows), "
        "scrapes again and compares your numbers with the counters'."
    ),
    models=(MODEL,),
)
def _check_metrics_window(answer: Callable[[str, str, str], Any], server: RunningServer | None) -> str:
    if answer is None:
        raise NotImplementedError("define window(before, after, model) and run the check again")
    try:  # an untouched skeleton says so at once, before any load
        answer("", "", MODEL)
    except NotImplementedError:
        raise
    except Exception:  # noqa: BLE001 - two empty pages may well break a right answer: the real check follows
        pass
    with contextlib.ExitStack() as stack:
        if server is None or not getattr(getattr(server, "options", None), "cache_size", None):
            server = own_server()  # a server without a response cache (or none): ours, which has one
        live = server.model_config(MODEL)
        if not (live.response_cache.enable and cache_metrics.has_cache_counters(stats.scrape_metrics(server), MODEL)):
            if server not in _OWN:
                stack.callback(server.load_model, MODEL, live)  # the learner's server back as it was
            cache_metrics.load_afresh(server, MODEL, cache_metrics.with_cache(live))
        before, after = scrapes(server)
        got = answer(before, after, MODEL)
    return judge(got, expected_window(), after)


def own_server() -> TritonServer:
    """The checker's server with a response cache: started on first use, stopped when the process exits."""
    if not _OWN or not _OWN[0].is_running():
        server = TritonServer(models=[MODEL], cache_size=1 << 20, target="local").start()
        atexit.register(server.stop)
        _OWN[:] = [server]
    return _OWN[0]


def scrapes(server: RunningServer) -> tuple[str, str]:
    """Send the traffic; the metrics pages before and after :data:`WINDOW`, each once it shows what was sent."""
    rng = np.random.default_rng()  # unseeded: the cache outlives unloads, a repeated check needs new data
    inputs: dict[str, np.ndarray] = {}

    def send(sends: tuple[tuple[str, int], ...]) -> None:
        for key, rows in sends:
            x = inputs.setdefault(key, rng.standard_normal((rows, 16)).astype(np.float32))
            infer(server, MODEL, {"INPUT0": x})

    origin = stats.scrape_metrics(server)  # nothing in flight: the counters rest
    send(BEFORE)
    start = cache_metrics.settled_page(server, MODEL, expected_window(BEFORE, frozenset()), since=origin)
    send(WINDOW)
    return start, cache_metrics.settled_page(server, MODEL, expected_window(), since=start)


def judge(got: Any, truth: dict[str, float], after: str) -> str:
    """Compare the learner's dict with the window's numbers; name the counter behind each mistake."""
    if not isinstance(got, dict):
        raise ExerciseError(f"window must return a dict with keys {', '.join(KEYS)}, not {type(got).__name__}")
    missing = [k for k in KEYS if k not in got]
    if missing:
        raise ExerciseError(f"the dict lacks {', '.join(missing)}: return all of {', '.join(KEYS)}")
    since_load = cache_metrics.counters(after, MODEL)
    wrong = [k for k in KEYS if not _close(got[k], truth[k])]
    if not wrong:
        return (f"over the window: {truth['requests']} requests, {truth['cache_hits']} of them cache hits, "
                f"{truth['executions']} executions of {truth['avg_batch']:.2f} rows on average; the hits never ran.")
    key = wrong[0]
    said = got[key]
    if key in COUNTERS and _close(said, since_load[key]):
        hint = ("that is the counter's value since the model loaded: counters are cumulative, subtract the "
                "'before' page's value")
    elif key == "requests" and _close(said, truth["inferences"]):
        hint = ("that is nv_inference_count: inferences, the rows of the requests that executed (cache hits "
                "excluded); requests are nv_inference_request_success")
    elif key == "executions" and _close(said, truth["requests"]):
        hint = ("that counts every request, but a cache hit never reaches the model: executions are "
                "nv_inference_exec_count")
    elif key == "avg_batch" and _close(said, truth["requests"] / truth["executions"]):
        hint = ("that divides requests by executions, but cache hits never ran and a request may hold several "
                "rows: divide inferences (nv_inference_count) by executions")
    elif key == "avg_batch" and _close(said, truth["executions"] / truth["inferences"]):
        hint = "that is executions per inference: invert it"
    elif key == "cache_hits" and _close(said, truth["executions"]):
        hint = "that is the number of misses: hits are nv_cache_num_hits_per_model"
    else:
        hint = f"the counter to read is {COUNTERS.get(key, 'nv_inference_count / nv_inference_exec_count')}"
    raise ExerciseError(f"'{key}': you said {_show(said)}, the window had {_show(truth[key])}: {hint}")


def _close(a: Any, b: float) -> bool:
    try:
        return math.isclose(float(a), float(b), rel_tol=1e-6, abs_tol=1e-9)
    except (TypeError, ValueError):
        return False


def _show(x: Any) -> str:
    if isinstance(x, (int, float)) and math.isfinite(x):
        return f"{x:.0f}" if float(x).is_integer() else f"{x:.4g}"
    return repr(x)
