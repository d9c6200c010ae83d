/*
 * clip.c - backend "clip": OUTPUT0 = INPUT0 clamped to [lo, hi], elementwise, FP32.
 *
 * Notebook 09's exercise. Complete the four places marked TODO(exercise), then run the check cell
 * (exercises.check("clip_backend", ...)). The checker builds this file with
 * gcc -Wall -Wextra -Werror -Wl,-z,defs, serves it as backend "clip" on a server of its own
 * (a crash cannot hurt yours), and sends it batched requests, bad ones among them.
 *
 * The model config the checker writes:
 *   backend: "clip"   max_batch_size: 16   dynamic_batching { max_queue_delay_microseconds: ... }
 *   input  INPUT0  TYPE_FP32 dims [-1]       output OUTPUT0 TYPE_FP32 dims [-1]
 *   parameters { key: "lo" value { string_value: "-1.5" } }  (and "hi"; the numbers vary)
 *
 * This file holds the four functions you write. The rest of the backend is include/clip_backend.h
 * (next to this file), which this file includes: the model state's type ClipModel, read_bound, and
 * TRITONBACKEND_ModelInstanceExecute, which calls your clip_request for each request of a batch,
 * answers it with the error clip_request returns or sends its response with your send_response, then
 * reports statistics and releases every request.
 *
 * Helpers you may use (include/lab_backend_util.h and include/clip_backend.h): lab_errorf,
 * LAB_RETURN_IF_ERROR, lab_model_config_json, lab_json_parameter, read_bound, lab_get_input,
 * lab_gather_input, LAB_LOG. The API itself: include/lab_triton.h.
 */
#include "clip_backend.h"

TRITONSERVER_Error* TRITONBACKEND_ModelInitialize(TRITONBACKEND_Model* model) {
  const char* name = NULL;
  LAB_RETURN_IF_ERROR(TRITONBACKEND_ModelName(model, &name));
  /* TODO(exercise) 1: read the model config as JSON (lab_model_config_json, free it after), read
   * "lo" and "hi" with read_bound, refuse lo > hi with an error naming both (returning an error
   * fails the load, with your message in the server's answer), then keep the bounds as model state:
   * malloc a ClipModel and hand it to TRITONBACKEND_ModelSetState. */
  return lab_errorf(TRITONSERVER_ERROR_UNSUPPORTED, "%s: model '%s': ModelInitialize is not written yet",
                    BACKEND, name);
}

TRITONSERVER_Error* TRITONBACKEND_ModelFinalize(TRITONBACKEND_Model* model) {
  /* TODO(exercise) 2: the state you set in ModelInitialize is yours: get it back with
   * TRITONBACKEND_ModelState and free it. */
  (void)model;
  return NULL;
}

/* Clamp one request's INPUT0 into its response's OUTPUT0; *items = its batch size. */
static TRITONSERVER_Error* clip_request(const ClipModel* bounds, TRITONBACKEND_Request* request,
                                        TRITONBACKEND_Response* response, uint64_t* items) {
  /* TODO(exercise) 3: check INPUT0 (lab_get_input: present, FP32, bytes match the shape), copy it
   * into one block (lab_gather_input: it may arrive in several buffers), refuse a NaN element
   * with an error naming it, add OUTPUT0 with the input's shape (TRITONBACKEND_ResponseOutput),
   * get its buffer (TRITONBACKEND_OutputBuffer), write each element clamped to
   * [bounds->lo, bounds->hi], and set *items to the request's first dimension. Return NULL on
   * success, or the error: the caller answers this request with it. Free what you malloc. */
  (void)bounds;
  (void)request;
  (void)response;
  (void)items;
  return lab_errorf(TRITONSERVER_ERROR_UNSUPPORTED, "%s: clip_request is not written yet", BACKEND);
}

/* Send the response, complete and final; true when it was sent. */
static bool send_response(TRITONBACKEND_Response* response) {
  TRITONSERVER_Error* err = TRITONBACKEND_ResponseSend(response, TRITONSERVER_RESPONSE_COMPLETE_FINAL, NULL);
  if (err != NULL) {
    /* TODO(exercise) 4: the send failed. Who owns `response` now, and `err`? Do exactly what the
     * ownership rules allow (notebook 09, section 4), then return false: Execute skips this request. */
    return false;
  }
  return true;
}
