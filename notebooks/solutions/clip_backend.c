/*
 * clip.c - backend "clip": OUTPUT0 = INPUT0 clamped to [lo, hi], elementwise, FP32.
 *
 * Reference solution of notebook 09's exercise (the skeleton is notebooks/exercises/clip.c).
 * lo and hi come from the model config's parameters, read once per model in ModelInitialize and
 * kept as model state; Execute answers every request of a dynamic batch with its own response (a
 * bad request gets an error response, its batch-mates are still answered), reports statistics
 * and releases every request.
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
static TRITONSERVER_Error* read_bound(const char* json, const char* model, const char* key, float* value) {
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
  char* json = NULL;
  LAB_RETURN_IF_ERROR(lab_model_config_json(model, &json));
  ClipModel bounds = {0.0f, 0.0f};
  TRITONSERVER_Error* err = read_bound(json, name, "lo", &bounds.lo);
  if (err == NULL) err = read_bound(json, name, "hi", &bounds.hi);
  free(json);
  if (err != NULL) return err; /* the load fails with our reason: better than wrong answers */
  if (bounds.lo > bounds.hi) {
    return lab_errorf(TRITONSERVER_ERROR_INVALID_ARG, "%s: model '%s': lo (%g) must not exceed hi (%g)",
                      BACKEND, name, (double)bounds.lo, (double)bounds.hi);
  }
  ClipModel* state = malloc(sizeof *state);
  if (state == NULL) return lab_errorf(TRITONSERVER_ERROR_INTERNAL, "%s: out of memory", BACKEND);
  *state = bounds;
  err = TRITONBACKEND_ModelSetState(model, state);
  if (err != NULL) free(state); /* Triton did not take it: still ours */
  return err;
}

TRITONSERVER_Error* TRITONBACKEND_ModelFinalize(TRITONBACKEND_Model* model) {
  void* state = NULL;
  LAB_RETURN_IF_ERROR(TRITONBACKEND_ModelState(model, &state));
  free(state);
  return NULL;
}

/* Clamp one request's INPUT0 into its response's OUTPUT0; *items = its batch size. */
static TRITONSERVER_Error* clip_request(const ClipModel* bounds, TRITONBACKEND_Request* request,
                                        TRITONBACKEND_Response* response, uint64_t* items) {
  LabInput input;
  LAB_RETURN_IF_ERROR(lab_get_input(BACKEND, request, "INPUT0", TRITONSERVER_TYPE_FP32, &input));
  float* data = malloc(input.byte_size ? input.byte_size : 1);
  if (data == NULL) return lab_errorf(TRITONSERVER_ERROR_INTERNAL, "%s: out of memory", BACKEND);
  TRITONSERVER_Error* err = lab_gather_input(BACKEND, &input, data);
  for (uint64_t k = 0; err == NULL && k < input.elements; ++k) {
    if (isnan(data[k])) {
      err = lab_errorf(TRITONSERVER_ERROR_INVALID_ARG,
                       "%s: INPUT0 element %llu is NaN, which has no place in [lo, hi]; send numbers",
                       BACKEND, (unsigned long long)k);
    }
  }
  TRITONBACKEND_Output* output = NULL;
  float* out = NULL;
  if (err == NULL) {
    err = TRITONBACKEND_ResponseOutput(response, &output, "OUTPUT0", TRITONSERVER_TYPE_FP32,
                                       input.shape, input.dims);
  }
  if (err == NULL) {
    TRITONSERVER_MemoryType mem = TRITONSERVER_MEMORY_CPU;
    int64_t mem_id = 0;
    err = TRITONBACKEND_OutputBuffer(output, (void**)&out, input.byte_size, &mem, &mem_id);
    if (err == NULL && mem == TRITONSERVER_MEMORY_GPU) {
      err = lab_errorf(TRITONSERVER_ERROR_UNSUPPORTED, "%s: output buffer in GPU memory", BACKEND);
    }
  }
  if (err == NULL) {
    for (uint64_t k = 0; k < input.elements; ++k) out[k] = fminf(fmaxf(data[k], bounds->lo), bounds->hi);
    *items = input.dims > 0 ? (uint64_t)input.shape[0] : 1;
  }
  free(data);
  return err;
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
      /* The response is Triton's even now: log, free the error, never ResponseDelete it. */
      LAB_LOG(TRITONSERVER_LOG_ERROR, "%s: send failed: %s", BACKEND, TRITONSERVER_ErrorMessage(err));
      TRITONSERVER_ErrorDelete(err);
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
