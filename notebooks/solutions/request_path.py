"""Solution: a model's path (scheduler, backend) read from the config the server uses (notebook 00)."""


def answer(config):
    # The scheduler: core src/backend_model.cc SetConfiguredScheduler (r24.10 L821-847) checks
    # sequence_batching first, then dynamic_batching; an empty section counts (HasField, not its contents).
    if config.platform == "ensemble":
        return "ensemble", None  # the ensemble scheduler feeds other models; no backend of its own
    if config.HasField("sequence_batching"):
        scheduler = "sequence batcher"
    elif config.HasField("dynamic_batching"):
        scheduler = "dynamic batcher"
    else:
        scheduler = "default"
    # The backend: "python", or a Python-based backend (the server wrote runtime: "model.py" into the
    # live config when it found <backend dir>/<name>/model.py and no libtriton_<name>.so).
    if config.backend == "python" or config.runtime == "model.py":
        return scheduler, "python"
    return scheduler, "C"
