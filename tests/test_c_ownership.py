"""The response-ownership rule, checked over every C source we ship (no server needed).

``tritonbackend.h`` says that ``TRITONBACKEND_ResponseSend`` "transfers ownership of the response
object to Triton. The caller must not access or delete the response object after calling this
function." - on failure too: core's implementation
(https://github.com/triton-inference-server/core/blob/r24.10/src/backend_model.cc,
``TRITONBACKEND_ResponseSend``) wraps the response in a ``std::unique_ptr`` before it sends, so a
``TRITONBACKEND_ResponseDelete`` after a failed send frees it a second time. ``scale.c`` and
``digits_prep.c`` did exactly that until issue 15.

Why a static check and not a test that takes the failing path under load: in the core sources we
read (``InferenceResponse::Send`` / ``SendWithStatus`` in
https://github.com/triton-inference-server/core/blob/r24.10/src/infer_response.cc), every path of
the send returns ``Status::Success`` - the response goes to the delegator or to the front end's
completion callback, and nothing the send does can report an error. Triton 2.51 offers no request
parameter, server option or fault injection that makes ``ResponseSend`` fail, so the error branch
cannot be reached from a client; the only protection is not writing the double free, which this
check enforces.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lab_backends.lessons import c_source
from lab_backends.paths import PROJECT_ROOT

C_SOURCES = sorted(
    p for pattern in ("c_backends/**/*.c", "c_backends/**/*.h", "notebooks/**/*.c")
    for p in PROJECT_ROOT.glob(pattern)
)

#: The error path as scale.c had it: the double free the check must catch.
BUGGY = """
TRITONSERVER_Error* TRITONBACKEND_ModelInstanceExecute(
    TRITONBACKEND_ModelInstance* instance, TRITONBACKEND_Request** requests, uint32_t count) {
  for (uint32_t i = 0; i < count; ++i) {
    TRITONSERVER_Error* err = TRITONBACKEND_ResponseSend(slots[i].response, 1, NULL);
    if (err != NULL) { /* wrong: "not sent, the response is still ours" */
      TRITONSERVER_ErrorDelete(err);
      TRITONSERVER_Error* del = TRITONBACKEND_ResponseDelete(slots[ i ].response);
      if (del != NULL) TRITONSERVER_ErrorDelete(del);
    }
  }
  return NULL;
}
"""


def test_the_check_sees_the_sources_and_catches_the_double_free() -> None:
    names = {p.name for p in C_SOURCES}
    assert {"scale.c", "digits_prep.c", "lab_backend_util.h"} <= names, names
    problems = c_source.responses_deleted_after_send(BUGGY)
    assert len(problems) == 1 and "ResponseDelete(slots[i].response)" in problems[0], problems
    # Deleting a response that was never sent is allowed (the backend still owns it then).
    fine = BUGGY.replace("TRITONBACKEND_ResponseSend(slots[i].response", "TRITONBACKEND_ResponseSend(other")
    assert c_source.responses_deleted_after_send(fine) == []
    # A comment that mentions the call is not a call.
    assert c_source.responses_deleted_after_send(
        "void f(void) { send(r); /* TRITONBACKEND_ResponseSend(r, 0, 0); TRITONBACKEND_ResponseDelete(r); */ }") == []


@pytest.mark.parametrize("path", C_SOURCES, ids=lambda p: str(p.relative_to(PROJECT_ROOT)))
def test_no_c_source_deletes_a_response_after_sending_it(path: Path) -> None:
    assert c_source.responses_deleted_after_send(path.read_text()) == []


def test_scale_c_says_why_it_does_not_delete() -> None:
    execute = c_source.function(PROJECT_ROOT / "c_backends/scale/scale.c", "TRITONBACKEND_ModelInstanceExecute")
    assert "must not access or delete" in execute.text
