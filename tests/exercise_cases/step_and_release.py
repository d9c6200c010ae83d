"""Audit cases of ``step_and_release`` (notebook 08b): one step of one request of an iterative decoupled model.

Each answer is a function the checker copies into its model's model.py, where the real ``pb_utils``
and ``np`` are imported; the stand-in below only lets this file be imported outside the model.
"""

import numpy as np

from lab_backends.lessons.exercises.audit import Wrong

pb_utils = None  # the real module exists only inside the Python backend's stub process, where these functions run


def all_instead_of_reschedule(request, seq):
    last = seq.sent + 1 == seq.length
    if not last:
        request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_ALL)
    response = pb_utils.InferenceResponse([pb_utils.Tensor("TOKEN", np.array([seq.next_token()], dtype=np.int32))])
    request.get_response_sender().send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if last else 0)


def never_final(request, seq):
    response = pb_utils.InferenceResponse([pb_utils.Tensor("TOKEN", np.array([seq.next_token()], dtype=np.int32))])
    request.get_response_sender().send(response)
    if seq.sent < seq.length:  # counted after the send: more to come
        request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)


def reschedules_after_final(request, seq):
    last = seq.sent + 1 == seq.length
    response = pb_utils.InferenceResponse([pb_utils.Tensor("TOKEN", np.array([seq.next_token()], dtype=np.int32))])
    request.get_response_sender().send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if last else 0)
    request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)  # every step, the last one too


def every_step_for_every_request(request, seq):
    last = seq.sent + 1 >= 24  # the longest a request may ask: as static batching does, whatever this one asked
    if not last:
        request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
    response = pb_utils.InferenceResponse([pb_utils.Tensor("TOKEN", np.array([seq.next_token()], dtype=np.int32))])
    request.get_response_sender().send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if last else 0)


def whole_request_in_one_step(request, seq):
    sender = request.get_response_sender()
    for i in range(seq.length):
        response = pb_utils.InferenceResponse([pb_utils.Tensor("TOKEN", np.array([seq.next_token()], dtype=np.int32))])
        sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if i == seq.length - 1 else 0)


def uses_a_notebook_helper(request, seq):
    request.get_response_sender().send(token_response(seq.next_token()))  # noqa: F821 - defined in "the notebook"


WRONG = [
    Wrong("releases with ALL instead of RESCHEDULE", all_instead_of_reschedule,
          r"RELEASE_ALL instead of RESCHEDULE.*one step only"),
    Wrong("never sends the final flag", never_final, r"never the final flag"),
    Wrong("reschedules after the final response", reschedules_after_final,
          r"released with RESCHEDULE at step \d+, after its final response"),
    Wrong("generates every step for every request regardless of its length", every_step_for_every_request,
          r"regardless of its length"),
    Wrong("generates the whole request in one step (static batching)", whole_request_in_one_step,
          r"tokens in one step"),
    Wrong("calls a helper only the notebook has", uses_a_notebook_helper,
          r"uses token_response, which the model does not have"),
]


def final_alone_one_step_later(request, seq):
    """Every token on its own step, then one more step: an empty response carrying only the final flag."""
    sender = request.get_response_sender()
    if seq.sent == seq.length:
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)  # released with ALL: nothing set
        return
    token = pb_utils.Tensor("TOKEN", np.array([seq.next_token()], dtype=np.int32))
    sender.send(pb_utils.InferenceResponse(output_tensors=[token]))
    request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)


def reads_length_itself(request, seq):
    """LENGTH read from the request's input, the release flag set explicitly on every step, ALL on the last."""
    length = int(pb_utils.get_input_tensor_by_name(request, "LENGTH").as_numpy().reshape(-1)[0])
    remaining = length - seq.sent
    request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_ALL if remaining == 1
                              else pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
    out = pb_utils.InferenceResponse([pb_utils.Tensor("TOKEN", np.array([seq.next_token()], dtype=np.int32))])
    request.get_response_sender().send(out, pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if remaining == 1 else 0)


ALTERNATIVES = [final_alone_one_step_later, reads_length_itself]
