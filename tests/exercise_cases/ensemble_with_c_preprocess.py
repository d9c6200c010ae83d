"""Audit cases of ``ensemble_with_c_preprocess`` (notebook 06): the ensemble with the C preprocessing step."""

from lab_backends.lessons.exercises.audit import Wrong
from lab_backends.lessons.exercises.registry import load_solution
from lab_backends.server.repository import config_text


def _same_name(config):
    return config


def _still_python(config):
    config.name = "my_ensemble_c"
    return config


def _outputs_dropped(config):
    mine = load_solution("ensemble_with_c_preprocess")(config)
    del mine.output[:]
    mine.ensemble_scheduling.step[-1].output_map.clear()
    return mine


WRONG = [
    Wrong("keeps digits_ensemble's name", _same_name, r"name the ensemble"),
    Wrong("renames it but keeps the Python step", _still_python, r"replace digits_preprocess by digits_preprocess_c"),
    Wrong("config text that does not parse", lambda config: "name: 'my_ensemble_c' steps {",
          r"not a valid Triton model config"),
    Wrong("drops the outputs", _outputs_dropped, r"refused to load your ensemble"),
]

ALTERNATIVES = [
    # config.pbtxt text instead of a ModelConfig.
    lambda config: config_text(load_solution("ensemble_with_c_preprocess")(config)),
]
