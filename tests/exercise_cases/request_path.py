"""Audit cases of ``request_path`` (notebook 00): a model's scheduler and backend, predicted from its config."""

from lab_backends.lessons.exercises.audit import Wrong
from lab_backends.server.repository import config_text


def _scheduler(config):
    if config.platform == "ensemble":
        return "ensemble"
    if config.HasField("sequence_batching"):
        return "sequence batcher"
    return "dynamic batcher" if config.HasField("dynamic_batching") else "default"


def _backend(config):
    if config.platform == "ensemble":
        return None
    return "python" if config.backend == "python" or config.runtime == "model.py" else "C"


WRONG = [
    Wrong("takes the backend's name at its word: sklearn is not python, so it must be C",
          lambda c: (_scheduler(c), None if c.platform == "ensemble" else ("python" if c.backend == "python" else "C")),
          r"digits_logreg: you said \('dynamic batcher', 'C'\).*Python-based backend"),
    Wrong("batching follows max_batch_size: > 0 means the dynamic batcher",
          lambda c: ("ensemble" if c.platform == "ensemble" else
                     "dynamic batcher" if c.max_batch_size > 0 else "default", _backend(c)),
          r"running_mean: you said \('dynamic batcher'.*correlation ID.*sequence_batching"),
    Wrong("the dynamic batcher needs a queue delay (an empty dynamic_batching { } does nothing)",
          lambda c: (_scheduler(c) if _scheduler(c) != "dynamic batcher"
                     or c.dynamic_batching.max_queue_delay_microseconds else "default", _backend(c)),
          r"cost_model: you said \('default'.*even an empty one"),
    Wrong("an ensemble runs in the Python backend, like its steps",
          lambda c: (_scheduler(c), _backend(c) or "python"),
          r"digits_ensemble: you said \('ensemble', 'python'\).*executed each of its steps.*no backend of its own"),
    Wrong("names the backend by its config name instead of 'python' / 'C' / None",
          lambda c: (_scheduler(c), c.backend or None),
          r"named backend 'scale'; name one of 'python', 'C' or None"),
]


def _from_text(config):
    """Reads the config's text (as `print(config_text(config))` shows it) and returns a list."""
    text = config_text(config)
    sections = [line.split("{")[0].strip() for line in text.splitlines() if line.rstrip().endswith("{")]
    if 'platform: "ensemble"' in text:
        return ["ensemble", None]
    scheduler = ("sequence batcher" if "sequence_batching" in sections
                 else "dynamic batcher" if "dynamic_batching" in sections else "default")
    runs_python = 'backend: "python"' in text or 'runtime: "model.py"' in text
    return [scheduler, "python" if runs_python else "C"]


_BY_ONEOF = {"dynamic_batching": "dynamic batcher", "sequence_batching": "sequence batcher",
             "ensemble_scheduling": "ensemble", None: "default"}

ALTERNATIVES = [
    # The scheduling oneof of ModelConfig, and any runtime that is a Python file.
    lambda c: (_BY_ONEOF[c.WhichOneof("scheduling_choice")],
               None if c.WhichOneof("scheduling_choice") == "ensemble_scheduling"
               else "python" if c.backend == "python" or c.runtime.endswith(".py") else "C"),
    _from_text,
]
