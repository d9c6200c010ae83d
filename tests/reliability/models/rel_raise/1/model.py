"""rel_raise: a model whose execute raises, the way a bug in a learner's model.py would."""


class TritonPythonModel:
    def execute(self, requests):
        raise ValueError("rel_raise: deliberate failure in execute (a bug in model.py)")
