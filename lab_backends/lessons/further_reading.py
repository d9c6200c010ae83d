"""Where to go deeper after each notebook: upstream Triton documents and source files.

Why a data structure and not hand-written cells: the links are the source of truth here, and
``render`` turns them into each notebook's last markdown cell. ``append`` (re)writes that cell, so a
notebook rewritten elsewhere gets its links back with one command
(``python -m lab_backends.lessons.further_reading``), and ``tests/test_further_reading.py`` checks
that every notebook ends with exactly what is listed here.

Links point at the ``r24.10`` release branches (Triton 2.51, the server this workbench embeds),
so that what a learner reads matches what the notebook ran.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from lab_backends.errors import LabBackendsError
from lab_backends.paths import lesson_notebooks

RELEASE = "r24.10"  # the branch of Triton 2.51.0
SERVER = f"https://github.com/triton-inference-server/server/blob/{RELEASE}"
CORE = f"https://github.com/triton-inference-server/core/blob/{RELEASE}"
BACKEND = f"https://github.com/triton-inference-server/backend/blob/{RELEASE}"
PYTHON_BACKEND = f"https://github.com/triton-inference-server/python_backend/blob/{RELEASE}"
COMMON = f"https://github.com/triton-inference-server/common/blob/{RELEASE}"
PYTORCH_BACKEND = f"https://github.com/triton-inference-server/pytorch_backend/blob/{RELEASE}"
ONNX_BACKEND = f"https://github.com/triton-inference-server/onnxruntime_backend/blob/{RELEASE}"
TF_BACKEND = f"https://github.com/triton-inference-server/tensorflow_backend/blob/{RELEASE}"
TRTLLM_BACKEND = f"https://github.com/triton-inference-server/tensorrtllm_backend/blob/{RELEASE}"
VLLM_BACKEND = f"https://github.com/triton-inference-server/vllm_backend/blob/{RELEASE}"

#: Hosts a further-reading link may point at: Triton's own repositories and documentation.
UPSTREAM_PREFIXES = (
    "https://github.com/triton-inference-server/",
    "https://docs.nvidia.com/deeplearning/triton-inference-server/",
)

HEADING = "## Further reading"

#: notebook key (the file name before its first underscore) -> [(title, url, why it goes deeper)]
LINKS: dict[str, list[tuple[str, str, str]]] = {
    "00": [
        ("Triton architecture", f"{SERVER}/docs/user_guide/architecture.md",
         "front ends, schedulers and backends, the picture this notebook drew from the live server"),
        ("Model repository", f"{SERVER}/docs/user_guide/model_repository.md",
         "the folder layout, versions and files the server reads"),
        ("Model configuration", f"{SERVER}/docs/user_guide/model_configuration.md",
         "every field of config.pbtxt, including auto-completed ones"),
        ("model_config.proto", f"{COMMON}/protobuf/model_config.proto",
         "the protobuf behind config.pbtxt, with a comment on every field"),
        ("KServe v2 protocol in Triton", f"{SERVER}/docs/protocol/README.md",
         "health, metadata and the extensions the server advertised"),
    ],
    "01": [
        ("Inference protocols and APIs", f"{SERVER}/docs/customization_guide/inference_protocols.md",
         "HTTP/REST, gRPC and the in-process C API side by side"),
        ("Binary tensor data extension", f"{SERVER}/docs/protocol/extension_binary_data.md",
         "the Inference-Header-Content-Length layout measured here"),
        ("grpc_service.proto", f"{COMMON}/protobuf/grpc_service.proto", "the gRPC messages behind ModelInfer"),
        ("Client libraries", f"https://github.com/triton-inference-server/client/blob/{RELEASE}/README.md",
         "tritonclient's HTTP and gRPC clients, sync and async"),
    ],
    "02": [
        ("Triton trace", f"{SERVER}/docs/user_guide/trace.md",
         "--trace-config, the TIMESTAMPS level and what each timestamp name means"),
        ("Trace extension", f"{SERVER}/docs/protocol/extension_trace.md",
         "the (restricted) runtime trace settings API"),
        ("tritonserver.h: InferenceTrace", f"{CORE}/include/triton/core/tritonserver.h",
         "TRITONSERVER_InferenceTraceActivity: the core's REQUEST, QUEUE and COMPUTE activities "
         "(the HTTP_*, GRPC_* and INFER_RESPONSE_COMPLETE names come from the front ends)"),
        ("BLS in the Python backend", f"{PYTHON_BACKEND}/README.md#business-logic-scripting",
         "child requests, and passing trace=request.trace()"),
    ],
    "03": [
        ("Schedulers and batchers", f"{SERVER}/docs/user_guide/model_configuration.md#scheduling-and-batching",
         "default scheduler, dynamic batcher, preferred sizes, queue delay"),
        ("Optimization", f"{SERVER}/docs/user_guide/optimization.md",
         "dynamic batching and instance groups as performance tools"),
        ("dynamic_batch_scheduler.cc", f"{CORE}/src/dynamic_batch_scheduler.cc",
         "the batcher itself: how a batch is formed and when it is sent"),
        ("Performance tuning", f"{SERVER}/docs/user_guide/performance_tuning.md",
         "measuring latency and throughput the way this notebook does, with perf_analyzer"),
    ],
    "03b": [
        ("Ragged batching", f"{SERVER}/docs/user_guide/ragged_batching.md",
         "allow_ragged_batch and the batch inputs that tell a backend where each request starts"),
        ("Queue policy and priorities", f"{COMMON}/protobuf/model_config.proto",
         "ModelQueuePolicy (max_queue_size, default_timeout_microseconds, allow_timeout_override) and "
         "priority_levels, with a comment on every field"),
        ("Instance groups", f"{SERVER}/docs/user_guide/model_configuration.md#instance-groups",
         "count and kind of instances: the rows of the batch timeline"),
        ("Python backend: one process per instance", f"{PYTHON_BACKEND}/README.md",
         "the stub process of each instance, and why threads inside execute() do not add cores"),
        ("dynamic_batch_scheduler.cc", f"{CORE}/src/dynamic_batch_scheduler.cc",
         "where requests are queued, batched and handed to a free instance (the priority levels and "
         "timeouts of its queue are implemented in src/scheduler_utils.cc, PriorityQueue)"),
    ],
    "04": [
        ("Python backend", f"{PYTHON_BACKEND}/README.md",
         "initialize/execute/finalize, auto_complete_config, errors, custom metrics"),
        ("triton_python_backend_utils.py", f"{PYTHON_BACKEND}/src/resources/triton_python_backend_utils.py",
         "the pb_utils helpers model.py imports"),
        ("Python backend examples", f"{PYTHON_BACKEND}/examples",
         "add_sub, auto_complete, custom_metrics and more, runnable here"),
        ("Model management", f"{SERVER}/docs/user_guide/model_management.md",
         "loading and reloading a model, as done with each new model.py"),
    ],
    "05": [
        ("PyTorch (libtorch) backend", f"{PYTORCH_BACKEND}/README.md", "TorchScript serving, parameters and threads"),
        ("Model configuration: PyTorch naming",
         f"{SERVER}/docs/user_guide/model_configuration.md#special-conventions-for-pytorch-backend",
         "forward() argument names and the <name>__<index> convention"),
        ("ONNX Runtime backend", f"{ONNX_BACKEND}/README.md",
         "execution providers, thread options and session settings"),
        ("TensorFlow backend", f"{TF_BACKEND}/README.md#parameters",
         "tensorflow_savedmodel, TF_NUM_INTRA_THREADS / TF_NUM_INTER_THREADS, TF_SIGNATURE_DEF"),
        ("Model repository: TensorFlow models", f"{SERVER}/docs/user_guide/model_repository.md#tensorflow-models",
         "model.savedmodel: a directory, not a file"),
        ("Python backend: frameworks inside model.py", f"{PYTHON_BACKEND}/README.md",
         "EXECUTION_ENV_PATH and wrapping any framework"),
    ],
    "06": [
        ("Ensemble models", f"{SERVER}/docs/user_guide/architecture.md#ensemble-models",
         "ensemble_scheduling steps and tensor mapping"),
        ("Business Logic Scripting", f"{PYTHON_BACKEND}/README.md#business-logic-scripting",
         "calling models from model.py, sync and async"),
        ("BLS example", f"{PYTHON_BACKEND}/examples/bls", "the upstream BLS example this notebook's pipeline follows"),
        ("Model configuration: ensembles", f"{SERVER}/docs/user_guide/model_configuration.md",
         "platform: \"ensemble\" and input/output mapping fields"),
    ],
    "07": [
        ("Model management", f"{SERVER}/docs/user_guide/model_management.md",
         "NONE/POLL/EXPLICIT modes, load/unload, config overrides"),
        ("Model repository extension", f"{SERVER}/docs/protocol/extension_model_repository.md",
         "index, load (with config and files) and unload over HTTP/gRPC"),
        ("Model repository: versions", f"{SERVER}/docs/user_guide/model_repository.md#model-versions",
         "version folders and version_policy"),
        ("Inference protocols: restricted APIs", f"{SERVER}/docs/customization_guide/inference_protocols.md",
         "--http-restricted-api and --grpc-restricted-protocol"),
    ],
    "08": [
        ("Decoupled models", f"{SERVER}/docs/user_guide/decoupled_models.md",
         "many responses per request, streamed over gRPC"),
        ("Generate extension", f"{SERVER}/docs/protocol/extension_generate.md",
         "generate and generate_stream (server-sent events)"),
        ("Sequence extension", f"{SERVER}/docs/protocol/extension_sequence.md",
         "sequence_id, sequence_start and sequence_end on the wire"),
        ("Stateful models", f"{SERVER}/docs/user_guide/architecture.md#stateful-models",
         "the sequence batcher, control inputs and strategies"),
        ("Decoupled Python example", f"{PYTHON_BACKEND}/examples/decoupled", "response senders in model.py"),
    ],
    "08b": [
        ("Python backend: request rescheduling", f"{PYTHON_BACKEND}/README.md#request-rescheduling",
         "set_release_flags(TRITONSERVER_REQUEST_RELEASE_RESCHEDULE), decoupled and not"),
        ("sequence_utils.cc", f"{CORE}/src/sequence_batch_scheduler/sequence_utils.cc",
         "IterativeSequencer::RescheduleRequest: what the scheduler does with a released request"),
        ("sequence_batch_scheduler.cc", f"{CORE}/src/sequence_batch_scheduler/sequence_batch_scheduler.cc",
         "the direct and oldest batchers that form each step, null requests included"),
        ("Model configuration: iterative sequences",
         f"{SERVER}/docs/user_guide/model_configuration.md#iterative-sequences",
         "iterative_sequence: true, marked provisional at r24.10"),
        ("sequence_utils.h", f"{CORE}/src/sequence_batch_scheduler/sequence_utils.h",
         "IterativeSequencer: a correlation ID and START flag for a request that has none"),
    ],
    "09": [
        ("Backend repository", f"{BACKEND}/README.md", "what a backend is and the backend API's lifecycle"),
        ("tritonbackend.h", f"{CORE}/include/triton/core/tritonbackend.h",
         "the backend C API: models, instances, requests, responses"),
        ("tritonserver.h", f"{CORE}/include/triton/core/tritonserver.h",
         "the server C API the backend API builds on (errors, tensors, messages)"),
        ("Backend examples", f"{BACKEND}/examples/README.md", "the minimal and recommended example backends"),
    ],
    "09b": [
        ("Custom batching", f"{SERVER}/docs/user_guide/model_configuration.md#custom-batching",
         "the five functions, TRITON_BATCH_STRATEGY_PATH and where Triton looks for batchstrategy.so"),
        ("tritonbackend.h: batching", f"{CORE}/include/triton/core/tritonbackend.h#L1710-L1767",
         "the declarations of the batching API, with what each pointer holds"),
        ("dynamic_batch_scheduler.cc", f"{CORE}/src/dynamic_batch_scheduler.cc",
         "GetDynamicBatch: where IncludeRequest is asked, and what a refusal does to the pending batch"),
        ("backend_model.cc", f"{CORE}/src/backend_model.cc",
         "how a model finds, loads, checks and initializes its strategy (SetBatchingStrategy)"),
        ("volume_batching example", f"{BACKEND}/examples/batching_strategies/volume_batching/src/volume_batching.cc",
         "upstream's byte budget in C++ (it refuses a request heavier than the budget: see section 1)"),
    ],
    "09d": [
        ("README.md", f"{BACKEND}/README.md#how-can-i-develop-my-own-triton-backend",
         "how upstream says to start one: ask whether the backend already exists, then follow the tutorial of "
         "examples/ (a shared library behind the backend C API)"),
        ("recommended.cc", f"{BACKEND}/examples/backends/recommended/src/recommended.cc#L248-L325",
         "ValidateModelConfig: the recommended backend checks the config's inputs and outputs at load, the "
         "step lab_executorch does against the program's own metadata"),
        ("libtorch.cc", f"{PYTORCH_BACKEND}/src/libtorch.cc#L959-L1133",
         "ValidateInputs: pytorch_backend checks the config's inputs against the TorchScript method's "
         "arguments at instance load"),
        ("recommended.cc", f"{BACKEND}/examples/backends/recommended/src/recommended.cc#L476-L746",
         "TRITONBACKEND_ModelInstanceExecute: responses first, every request answered and released, statistics"),
    ],
    "08c": [
        ("sequence_batch_scheduler.cc", f"{CORE}/src/sequence_batch_scheduler/sequence_batch_scheduler.cc#L1583-L1588",
         "the direct batcher forms the next step only once the last execution completed: every rescheduled "
         "sequence is in each step, which lets a backend free the blocks of one that is missing"),
        ("Python backend: request rescheduling", f"{PYTHON_BACKEND}/README.md#request-rescheduling",
         "set_release_flags(TRITONSERVER_REQUEST_RELEASE_RESCHEDULE): how generate_kv lets a sequence wait for memory"),
        ("TensorRT-LLM backend: model configuration", f"{TRTLLM_BACKEND}/docs/model_config.md#tensorrt_llm-model",
         "the tensorrt_llm model's KV-cache and scheduling parameters: kv_cache_free_gpu_mem_fraction, "
         "enable_kv_cache_reuse, enable_chunked_context, batch_scheduler_policy"),
        ("model_instance_state.cc", f"{TRTLLM_BACKEND}/inflight_batcher_llm/src/model_instance_state.cc#L719-L755",
         "TensorRT-LLM backend's Execute hands each request to the executor, which runs in-flight batching itself"),
        ("vLLM backend: src/model.py", f"{VLLM_BACKEND}/src/model.py#L545-L559",
         "execute puts every request on vLLM's AsyncLLMEngine and returns: the engine forms the steps and pages "
         "the cache"),
    ],
    "09c": [
        ("libtorch.cc", f"{PYTORCH_BACKEND}/src/libtorch.cc#L1264-L1567",
         "ProcessRequests: the collector, one forward() per batch, the responder, statistics and release"),
        ("backend_input_collector.cc", f"{BACKEND}/src/backend_input_collector.cc#L200-L258",
         "ProcessTensor: every request's input into one buffer at a running offset (pinned and GPU copies too)"),
        ("backend_output_responder.cc", f"{BACKEND}/src/backend_output_responder.cc#L50-L143",
         "ProcessTensor: the batch output sliced by each request's shape[0] into its response"),
        ("tensorflow.cc", f"{TF_BACKEND}/src/tensorflow.cc#L743-L757",
         "Triton's TensorFlow backend, the same loop in C++: GetModel gives each instance a session of its own "
         "unless the model's MAX_SESSION_SHARE_COUNT parameter (default 1, L1034) lets instances share one"),
        ("python_be.cc", f"{PYTHON_BACKEND}/src/python_be.cc#L1322-L1353",
         "where the Python backend stamps compute start and end around the hand-off to the stub"),
    ],
    "10": [
        ("Metrics", f"{SERVER}/docs/user_guide/metrics.md",
         "every nv_inference_* family, summaries and --metrics-config"),
        ("Statistics extension", f"{SERVER}/docs/protocol/extension_statistics.md",
         "the fields of /v2/models/<model>/stats"),
        ("Response cache", f"{SERVER}/docs/user_guide/response_cache.md",
         "--cache-config, response_cache in the model config, what is hashed"),
        ("Rate limiter", f"{SERVER}/docs/user_guide/rate_limiter.md", "resources, priorities and --rate-limit"),
        ("metric_model_reporter.cc", f"{CORE}/src/metric_model_reporter.cc",
         "which --metrics-config keys exist, and how summaries are created"),
    ],
    "11": [
        ("Trace", f"{SERVER}/docs/user_guide/trace.md",
         "every timestamp of the waterfall, trace settings, and ensemble/BLS children"),
        ("Binary tensor data extension", f"{SERVER}/docs/protocol/extension_binary_data.md",
         "the REST binary body the inspector shows next to the JSON one"),
        ("Ensemble models", f"{SERVER}/docs/user_guide/architecture.md#ensemble-models",
         "the pipeline whose children the waterfall draws"),
        ("Business logic scripting", f"{PYTHON_BACKEND}/README.md#business-logic-scripting",
         "BLS: the same pipeline written in model.py"),
        ("Statistics extension", f"{SERVER}/docs/protocol/extension_statistics.md",
         "the counts behind the statistics delta of your send"),
    ],
}


def _number(notebook: str | Path) -> str:
    """The key of a notebook: its file name before the first underscore (``03b``, ``11``)."""
    return Path(notebook).name.split("_", 1)[0]


def links_for(notebook: str | Path) -> list[tuple[str, str, str]]:
    """The links for one notebook (by its key: ``03``, ``03b``, ``11``)."""
    number = _number(notebook)
    if number not in LINKS:
        raise LabBackendsError(
            f"no further-reading links for {Path(notebook).name}: add at least three upstream links under "
            f"key {number!r} in lab_backends/lessons/further_reading.py (LINKS), then run "
            "`python -m lab_backends.lessons.further_reading` to write the notebook's last cell"
        )
    return LINKS[number]


def render(notebook: str | Path) -> str:
    """The markdown of a notebook's last cell: a heading and one bullet per link."""
    lines = [HEADING, "Upstream documents and source files (Triton 2.51, release branch r24.10) "
                      "that go deeper on this notebook:"]
    lines += [f"- [{title}]({url}): {why}" for title, url, why in links_for(notebook)]
    return "\n".join(lines)


def _source_lines(text: str) -> list[str]:
    out = text.splitlines(keepends=True)
    if out and out[-1].endswith("\n"):
        out[-1] = out[-1][:-1]
    return out


def append(path: str | Path) -> bool:
    """Write (or rewrite) the Further reading cell as the notebook's last cell; True if the file changed.

    Keeps the repository's JSON format (indent 1, UTF-8, trailing newline) so diffs stay small.
    """
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    book = json.loads(text)
    cell = {"cell_type": "markdown", "id": "further-reading", "metadata": {},
            "source": _source_lines(render(path))}
    if book.get("nbformat", 4) == 4 and book.get("nbformat_minor", 0) < 5:
        del cell["id"]  # cell ids exist from nbformat 4.5 on
    cells = book["cells"]
    if cells and cells[-1]["cell_type"] == "markdown" and "".join(cells[-1]["source"]).startswith(HEADING):
        cell["metadata"] = cells[-1].get("metadata", {})
        cells[-1] = cell
    else:
        cells.append(cell)
    new = json.dumps(book, indent=1, ensure_ascii=False) + "\n"
    if new != text:
        path.write_text(new, encoding="utf-8")
    return new != text


def main(argv: list[str]) -> int:
    """``python -m lab_backends.lessons.further_reading [NOTEBOOK ...]`` (default: notebooks/*.ipynb)."""
    paths = [Path(a) for a in argv] or lesson_notebooks()
    for path in paths:
        print(("rewrote " if append(path) else "unchanged ") + str(path))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
