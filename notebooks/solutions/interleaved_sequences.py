"""Solution: advance several sequences of running_mean in turn, with START/END flags (notebook 08)."""

import numpy as np

from lab_backends.client.infer import infer


def answer(server, sequences):
    means = {}
    rounds = max(len(values) for values in sequences.values())
    for i in range(rounds):
        for corrid, values in sequences.items():
            if i >= len(values):
                continue  # this sequence has ended already
            out = infer(
                server, "running_mean", {"VALUE": np.array([[values[i]]], np.float32)},
                sequence_id=corrid,                  # the correlation ID routes it to its state
                sequence_start=i == 0,               # START resets the state
                sequence_end=i == len(values) - 1,   # END frees the slot for other sequences
            )
            means[corrid] = float(out["MEAN"][0, 0])
    return means
