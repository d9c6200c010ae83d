"""Solution: serve versions 1 and 3 side by side with max_batch_size 4, by a config override (notebook 07)."""


def answer(server, name):
    config = server.model_config(name)  # the WHOLE current config: an override replaces all of it
    config.version_policy.specific.versions.extend([1, 3])  # 'specific' replaces 'latest' (a oneof)
    config.max_batch_size = 4
    server.load_model(name, config=config)  # one load call; nothing on disk changes
