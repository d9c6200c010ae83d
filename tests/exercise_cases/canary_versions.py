"""Audit cases of ``canary_versions`` (notebook 07): versions 1 and 3 side by side, by one config override."""

from lab_backends.lessons.authoring import ModelConfig
from lab_backends.lessons.exercises.audit import Wrong


def _partial(server, name):
    config = ModelConfig(name=name, backend="python", max_batch_size=4)
    config.version_policy.specific.versions.extend([1, 3])
    server.load_model(name, config=config)


def _all_versions(server, name):
    config = server.model_config(name)
    config.version_policy.all.SetInParent()
    config.max_batch_size = 4
    server.load_model(name, config=config)


def _batch_unchanged(server, name):
    config = server.model_config(name)
    config.version_policy.specific.versions.extend([1, 3])
    server.load_model(name, config=config)


def _as_dict(server, name):
    """The override as a JSON-shaped dict (Triton's config JSON), versions listed highest first."""
    from google.protobuf.json_format import MessageToDict

    config = MessageToDict(server.model_config(name), preserving_proto_field_name=True)
    config["version_policy"] = {"specific": {"versions": [3, 1]}}
    config["max_batch_size"] = 4
    server.load_model(name, config=config)


WRONG = [
    Wrong("a partial override", _partial, r"replaces the whole config"),
    Wrong("serves every version", _all_versions, r"expected versions 1 and 3 READY and 2 not"),
    Wrong("leaves max_batch_size at 8", _batch_unchanged, r"max_batch_size 8, expected 4"),
]

ALTERNATIVES = [_as_dict]
