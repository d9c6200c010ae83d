"""Solution: one step of ONE request of an iterative decoupled model (notebook 08b).

The checker copies ``answer`` into its model's model.py, where ``pb_utils`` and ``np`` are imported
(``pb_utils`` exists only inside the Python backend's stub process, never in the notebook's kernel).
"""


def answer(request, seq):
    token = seq.next_token()
    last = seq.sent + 1 == seq.length  # seq.sent: tokens already sent to this request
    if not last:
        # Back into the scheduler's queue: this request runs again at the next step, beside whoever is there.
        request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
    response = pb_utils.InferenceResponse([pb_utils.Tensor("TOKEN", np.array([token], dtype=np.int32))])
    # The last token closes the stream; the request is then released with ALL, the default.
    flags = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if last else 0
    request.get_response_sender().send(response, flags=flags)
