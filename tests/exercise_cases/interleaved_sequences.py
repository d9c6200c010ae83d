"""Audit cases of ``interleaved_sequences`` (notebook 08): sequences of running_mean advanced in turn."""

import numpy as np

from lab_backends.client import sequences
from lab_backends.client.infer import infer
from lab_backends.lessons.exercises.audit import Wrong
from lab_backends.lessons.exercises.registry import load_solution


def _never_ends(server, seqs):
    means = {}
    for corrid, values in seqs.items():
        for i, v in enumerate(values):
            means[corrid] = sequences.step(server, corrid, v, start=i == 0, end=False)[0]
    return means


def _one_request_each(server, seqs):
    return {c: float(infer(server, "running_mean", {"VALUE": np.array(v, np.float32).reshape(-1, 1)},
                           sequence_id=c, sequence_start=True, sequence_end=True)["MEAN"][-1, 0])
            for c, v in seqs.items()}


def _starts_twice(server, seqs):
    for corrid, values in seqs.items():
        sequences.step(server, corrid, values[0], start=True)  # a false start, reset by the next START
    return load_solution("interleaved_sequences")(server, seqs)


def _off_by_one(server, seqs):
    return {c: m + 1 for c, m in load_solution("interleaved_sequences")(server, seqs).items()}


def _with_iterators(server, seqs):
    """Iterators instead of indices: each round takes the next value of every unfinished sequence."""
    pending = {c: list(v) for c, v in seqs.items()}
    sent = dict.fromkeys(seqs, 0)
    means = {}
    while pending:
        for corrid in list(pending):
            value = pending[corrid].pop(0)
            means[corrid] = sequences.step(server, corrid, value, start=sent[corrid] == 0,
                                           end=not pending[corrid])[0]
            sent[corrid] += 1
            if not pending[corrid]:
                del pending[corrid]
    return means


WRONG = [
    Wrong("never sends sequence_end", _never_ends, r"still open"),
    Wrong("sends each sequence as one request", _one_request_each, r"raised InferenceServerException"),
    Wrong("a false start before the real one", _starts_twice, r"received 16 requests, expected 13"),
    Wrong("reports the mean plus one", _off_by_one, r"ended with mean"),
]

ALTERNATIVES = [_with_iterators]
