/*
 * clip_backend.h - the part of backend "clip" (OUTPUT0 = INPUT0 clamped to [lo, hi], elementwise,
 * FP32) that notebook 09's exercise gives: the model state's type, reading a bound from the config,
 * TRITONBACKEND_Initialize and TRITONBACKEND_ModelInstanceExecute, which answers every request of a
 * dynamic batch with its own response (a bad request gets an error response, its batch-mates are
 * still answered), reports statistics and releases every request.
 *
 * The other part is the exercise, the four functions declared below: c_backends/clip/clip.c is the
 * backend's own (and the exercise's reference answer), exercises/clip.c the learner's. Either includes
 * this file once (it defines two entry points), so the backend is one file to build, as any other
 * backend of c_backends/.
 */
#ifndef LAB_CLIP_BACKEND_H
#define LAB_CLIP_BACKEND_H

#include <errno.h>
#include <math.h>

#include "lab_backend_util.h"

#define BACKEND "clip"

/* Per model: the bounds from config.pbtxt. */
typedef struct {
  float lo;
  float hi;
} ClipModel;

/* The exercise (defined by the file that includes this one), besides ModelInitialize/ModelFinalize:
 * clip_request clamps one request's INPUT0 into its response's OUTPUT0 and sets *items to its batch
 * size (an error: Execute answers the request with it); send_response sends a response, complete and
 * final, and says whether it was sent (Execute counts the request a success only then). */
static TRITONSERVER_Error* clip_request(const ClipModel* bounds, TRITONBACKEND_Request* request,
                                        TRITONBACKEND_Response* response, uint64_t* items);
static bool send_response(TRITONBACKEND_Response* response);

TRITONSERVER_Error* TRITONBACKEND_Initialize(TRITONBACKEND_Backend* backend) {
  (void)backend;
  return lab_check_api_version(BACKEND);
}

/* Parameter 'key' of the config as a finite float; a clear error when absent or not a number. */
static LAB_UNUSED TRITONSERVER_Error* read_bound(const char* json, const char* model, const char* key, float* value) {
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
    if (!send_response(response)) continue; /* sent or not, the response is Triton's now */
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

#endif /* LAB_CLIP_BACKEND_H */
