"""Triton's own model warm-up: a ``model_warmup`` entry built from a config's inputs.

Why the server warms up and not the client: a fresh Python stub's first ``execute()`` is slow, so a
lesson that reloads a model wants every instance to have run once before it measures. A client-side
warm-up goes through the scheduler, where a queue policy may expire or refuse it, by chance:

* a request's own timeout only *shortens* the policy's (core ``src/scheduler_utils.cc`` 180-184 at
  r24.10: ``override_timeout_us != 0 && override_timeout_us < timeout_us``), so asking for a long
  one cannot protect a warm-up from a 100 ms default;
* with any queue policy the batcher does not prefetch (``scheduler_utils.cc`` 364-375) and can sleep
  500 ms with requests queued (``dynamic_batch_scheduler.cc`` 329 and 450-481), long enough to expire them.

``model_warmup`` avoids both: during the load, each instance runs the samples itself
(``TritonBackendThread::InitAndWarmUpModelInstance`` -> ``TritonModelInstance::WarmUp``, which calls
the backend's ``Execute`` directly: ``src/backend_model_instance.cc`` 734-751 and 600-660), before the
model is READY and without any scheduler queue. A failing sample fails the load
(``"failed to run warmup sample ..."``), which :func:`~lab_backends.server.config_changes.apply_config`
reports as a :class:`~lab_backends.errors.ModelLoadError`. The warm-up's executions are counted in
the new model's statistics (measured: 3 instances x 2 requests gave ``execution_count`` 6 right
after the load): compare statistics across a window, never from zero.
"""

from __future__ import annotations

from lab_backends.errors import LoadSettingError
from lab_backends.server.repository import ModelConfig

#: The name of the sample this module adds (a config may carry others of its own).
SAMPLE = "lab_backends_zeros"


def with_warmup(config: ModelConfig, count: int = 1) -> ModelConfig:
    """A copy of ``config`` whose every instance runs ``count`` zero-filled requests of batch size 1 at load.

    Variable dimensions (``-1``) become 1: Triton refuses a warm-up sample with an unspecified
    dimension (``backend_model_instance.cc`` ~372-378). Any sample of this module already there is
    replaced, the config's own samples are kept.
    """
    if not 1 <= count <= 100:
        raise LoadSettingError(f"a warm-up runs 1..100 requests per instance, not {count}")
    warmed = ModelConfig()
    warmed.CopyFrom(config)
    kept = [w for w in warmed.model_warmup if w.name != SAMPLE]
    del warmed.model_warmup[:]
    warmed.model_warmup.extend(kept)
    sample = warmed.model_warmup.add(name=SAMPLE, batch_size=1, count=count)
    for tensor in config.input:
        if tensor.optional:
            continue
        entry = sample.inputs[tensor.name]
        entry.data_type = tensor.data_type
        entry.dims.extend(1 if d < 0 else d for d in tensor.dims)
        entry.zero_data = True
    return warmed
