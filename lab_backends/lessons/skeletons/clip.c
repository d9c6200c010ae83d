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
 * Helpers you may use (include/lab_backend_util.h, next to this file): lab_errorf, LAB_RETURN_IF_ERROR,
 * lab_model_config_json, lab_json_parameter, lab_get_input, lab_gather_input, lab_send_error,
 * lab_finish_request, LAB_LOG. The API itself: include/lab_triton.h.
 */
#include <errno.h>
#include <math.h>

#include "lab_backend_util.h"

#define BACKEND "clip"

/* Per model: the bounds from config.pbtxt. */
typedef struct {
  float lo;
  float hi;
} ClipModel;

TRITONSERVER_Error* TRITONBACKEND_Initialize(TRITONBACKEND_Backend* backend) {
  (void)backend;
  return lab_check_api_version(BACKEND);
}

/* Parameter 'key' of the config as a finite float; a clear error when absent or not a number. */
static LAB_UNUSED TRITONSERVER_Error* read_bound(const char* json, const char* model, const char* key,
                                                 float* value) {
  char text[64];
  bool found = false;
  LAB_RETURN_IF_ERROR(lab_json_parameter(json, key, text, sizeof text, &found));
  if (!found) {
    return lab_errorf(TRITONSERVER_ERROR_INVALID_ARG,
                      "%s: model '%s' needs parameter '%s'; add parameters { key: \"%s\" value { "
                      "string_value: \"<number>\" } } to its config.pbtxt", BACKEND, model, key, key);
  }
  errno = 0;
  char* end = NULL;
  float parsed = strtof(text, &end);
  if (errno != 0 || end == text || *end != '\0' || !isfinite(parsed)) {
    return lab_errorf(TRITONSERVER_ERROR_INVALID_ARG,
                      "%s: model '%s': parameter '%s' must be a finite number, got '%s'", BACKEND,
                      model, key, text);
  }
  *value = parsed;
  return NULL;
}

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

TRITONSERVER_Error* TRITONBACKEND_ModelInstanceExecute(
    TRITONBACKEND_ModelInstance* instance, TRITONBACKEND_Request** requests, uint32_t count) {
  uint64_t exec_start = lab_now_ns();
  TRITONBACKEND_Model* model = NULL;
  ClipModel* bounds = NULL;
  LAB_RETURN_IF_ERROR(TRITONBACKEND_ModelInstanceModel(instance, &model));
  LAB_RETURN_IF_ERROR(TRITONBACKEND_ModelState(model, (void**)&bounds));
  bool* ok = calloc(count ? count : 1, sizeof *ok);
  if (ok == NULL) return lab_errorf(TRITONSERVER_ERROR_INTERNAL, "%s: out of memory", BACKEND);

  /* From here on every request gets a response and a release, and Execute returns NULL. */
  uint64_t compute_start = lab_now_ns();
  uint64_t batch_size = 0;
  for (uint32_t i = 0; i < count; ++i) {
    TRITONBACKEND_Response* response = NULL;
    TRITONSERVER_Error* err = TRITONBACKEND_ResponseNew(&response, requests[i]);
    if (err != NULL) {
      LAB_LOG(TRITONSERVER_LOG_ERROR, "%s: cannot create a response: %s", BACKEND, TRITONSERVER_ErrorMessage(err));
      TRITONSERVER_ErrorDelete(err);
      continue;
    }
    uint64_t items = 0;
    err = clip_request(bounds, requests[i], response, &items);
    if (err != NULL) {
      lab_send_error(response, err); /* this request fails alone; its batch-mates go on */
      continue;
    }
    err = TRITONBACKEND_ResponseSend(response, TRITONSERVER_RESPONSE_COMPLETE_FINAL, NULL);
    if (err != NULL) {
      /* TODO(exercise) 4: the send failed. Who owns `response` now, and `err`? Do exactly what the
       * ownership rules allow (notebook 09, section 4), then skip this request (continue). */
      continue;
    }
    ok[i] = true;
    batch_size += items;
  }
  uint64_t compute_end = lab_now_ns();
  for (uint32_t i = 0; i < count; ++i) {
    lab_finish_request(instance, requests[i], ok[i], exec_start, compute_start, compute_end, compute_end);
  }
  if (batch_size > 0) {
    TRITONSERVER_Error* err = TRITONBACKEND_ModelInstanceReportBatchStatistics(
        instance, batch_size, exec_start, compute_start, compute_end, compute_end);
    if (err != NULL) TRITONSERVER_ErrorDelete(err);
  }
  free(ok);
  return NULL;
}
