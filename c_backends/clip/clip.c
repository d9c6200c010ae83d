/*
 * clip.c - backend "clip": OUTPUT0 = INPUT0 clamped to [lo, hi], elementwise, FP32.
 *
 * lo and hi come from the model config's parameters, read once per model in ModelInitialize and kept
 * as model state. This file holds the four functions notebook 09's exercise asks for (its skeleton is
 * lab_backends/lessons/skeletons/clip.c): it is the exercise's reference answer. The rest of the
 * backend, Execute included, is c_backends/include/clip_backend.h, which it includes; set-up builds
 * it as any backend of c_backends/ (lab_backends/server/cbackend.py build_all).
 */
#include "clip_backend.h"

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

/* Send the response, complete and final; true when it was sent. */
static bool send_response(TRITONBACKEND_Response* response) {
  TRITONSERVER_Error* err = TRITONBACKEND_ResponseSend(response, TRITONSERVER_RESPONSE_COMPLETE_FINAL, NULL);
  if (err != NULL) {
    /* The response is Triton's even now: log, free the error, never ResponseDelete it. */
    LAB_LOG(TRITONSERVER_LOG_ERROR, "%s: send failed: %s", BACKEND, TRITONSERVER_ErrorMessage(err));
    TRITONSERVER_ErrorDelete(err);
    return false;
  }
  return true;
}
