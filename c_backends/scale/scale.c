/*
 * scale.c - backend "scale": OUTPUT0 = INPUT0 * factor, for FP32 tensors of any length.
 *
 * The smallest backend that still shows everything the backend C API asks of us:
 *   backend -> model (reads the "factor" config parameter) -> instance -> Execute, where Execute
 *   handles a whole dynamic batch at once: it gathers every request's input (an input may arrive
 *   split over several buffers) into one block, computes once, scatters one response per
 *   request, reports per-request and batch statistics, and releases every request.
 * A bad request gets an error response of its own; the rest of the batch is still served.
 *
 * Build: lab_backends.cbackend.build("c_backends/scale/scale.c", "scale")
 */
#include <errno.h>
#include <math.h>

#include "lab_backend_util.h"

#define BACKEND "scale"

/* Per model: what the config says. */
typedef struct {
  float factor;
  int batching; /* max_batch_size > 0: the first dimension of each input is the batch */
} ScaleModel;

/* Per request inside one Execute call. */
typedef struct {
  TRITONBACKEND_Response* response; /* NULL once sent (or if it could not be created) */
  LabInput input;
  uint64_t offset; /* first element in the gathered block */
  bool ok;
} Slot;

TRITONSERVER_Error* TRITONBACKEND_Initialize(TRITONBACKEND_Backend* backend) {
  const char* name = NULL;
  LAB_RETURN_IF_ERROR(TRITONBACKEND_BackendName(backend, &name));
  LAB_LOG(TRITONSERVER_LOG_INFO, "%s: TRITONBACKEND_Initialize (backend '%s')", BACKEND, name);
  return lab_check_api_version(BACKEND);
}

TRITONSERVER_Error* TRITONBACKEND_ModelInitialize(TRITONBACKEND_Model* model) {
  const char* name = NULL;
  uint64_t version = 0;
  LAB_RETURN_IF_ERROR(TRITONBACKEND_ModelName(model, &name));
  LAB_RETURN_IF_ERROR(TRITONBACKEND_ModelVersion(model, &version));

  char* json = NULL;
  LAB_RETURN_IF_ERROR(lab_model_config_json(model, &json));
  char text[64] = "2"; /* the documented default */
  bool found = false;
  TRITONSERVER_Error* err = lab_json_parameter(json, "factor", text, sizeof text, &found);
  int batching = lab_json_int(json, "max_batch_size") > 0;
  free(json);
  if (err != NULL) return err;

  errno = 0;
  char* end = NULL;
  float factor = strtof(text, &end);
  if (errno != 0 || end == text || *end != '\0' || !isfinite(factor)) {
    /* Failing the load with the reason beats serving a model with a silently wrong factor. */
    return lab_errorf(TRITONSERVER_ERROR_INVALID_ARG,
                      "%s: model '%s': parameter 'factor' must be a finite number, got '%s'; fix "
                      "parameters { key: \"factor\" value { string_value: \"...\" } } in config.pbtxt",
                      BACKEND, name, text);
  }
  ScaleModel* state = malloc(sizeof *state);
  if (state == NULL) return lab_errorf(TRITONSERVER_ERROR_INTERNAL, "%s: out of memory", BACKEND);
  state->factor = factor;
  state->batching = batching;
  LAB_LOG(TRITONSERVER_LOG_INFO, "%s: TRITONBACKEND_ModelInitialize '%s' version %llu, factor %g%s",
          BACKEND, name, (unsigned long long)version, (double)factor, found ? "" : " (default)");
  return TRITONBACKEND_ModelSetState(model, state);
}

TRITONSERVER_Error* TRITONBACKEND_ModelFinalize(TRITONBACKEND_Model* model) {
  void* state = NULL;
  LAB_RETURN_IF_ERROR(TRITONBACKEND_ModelState(model, &state));
  free(state); /* we allocated it in ModelInitialize, so we free it */
  return NULL;
}

TRITONSERVER_Error* TRITONBACKEND_ModelInstanceInitialize(TRITONBACKEND_ModelInstance* instance) {
  const char* name = NULL;
  LAB_RETURN_IF_ERROR(TRITONBACKEND_ModelInstanceName(instance, &name));
  LAB_LOG(TRITONSERVER_LOG_INFO, "%s: TRITONBACKEND_ModelInstanceInitialize '%s'", BACKEND, name);
  return NULL; /* no per-instance state: the model state holds all we need */
}

/* The number of batch items a request contributes (its first dimension when batching). */
static uint64_t batch_items(const ScaleModel* model, const LabInput* input) {
  return model->batching && input->dims > 0 ? (uint64_t)input->shape[0] : 1;
}

/* Step 1: a response per request, and a checked input for each; bad requests are answered now. */
static uint64_t check_requests(const ScaleModel* model, TRITONBACKEND_Request** requests,
                               uint32_t count, Slot* slots) {
  uint64_t total = 0;
  for (uint32_t i = 0; i < count; ++i) {
    TRITONSERVER_Error* err = TRITONBACKEND_ResponseNew(&slots[i].response, requests[i]);
    if (err != NULL) { /* nothing to answer with: the request is still released later */
      LAB_LOG(TRITONSERVER_LOG_ERROR, "%s: cannot create a response: %s", BACKEND, TRITONSERVER_ErrorMessage(err));
      TRITONSERVER_ErrorDelete(err);
      slots[i].response = NULL;
      continue;
    }
    err = lab_get_input(BACKEND, requests[i], "INPUT0", TRITONSERVER_TYPE_FP32, &slots[i].input);
    if (err == NULL && model->batching && slots[i].input.dims < 2) {
      err = lab_errorf(TRITONSERVER_ERROR_INVALID_ARG, "%s: INPUT0 must be [batch, n]", BACKEND);
    }
    if (err != NULL) {
      lab_send_error(slots[i].response, err);
      slots[i].response = NULL;
      continue;
    }
    if (slots[i].input.buffers > 1) {
      LAB_LOG(TRITONSERVER_LOG_VERBOSE, "%s: request %u: INPUT0 arrived in %u buffers", BACKEND, i,
              slots[i].input.buffers);
    }
    slots[i].offset = total;
    slots[i].ok = true;
    total += slots[i].input.elements;
  }
  return total;
}

/* Step 3: one response per good request, holding its slice of the computed block. */
static TRITONSERVER_Error* send_output(Slot* slot, const float* out) {
  TRITONBACKEND_Output* output = NULL;
  void* buffer = NULL;
  TRITONSERVER_MemoryType mem = TRITONSERVER_MEMORY_CPU;
  int64_t mem_id = 0;
  uint64_t bytes = slot->input.elements * sizeof(float);
  LAB_RETURN_IF_ERROR(TRITONBACKEND_ResponseOutput(slot->response, &output, "OUTPUT0",
                                                   TRITONSERVER_TYPE_FP32, slot->input.shape,
                                                   slot->input.dims));
  LAB_RETURN_IF_ERROR(TRITONBACKEND_OutputBuffer(output, &buffer, bytes, &mem, &mem_id));
  if (mem == TRITONSERVER_MEMORY_GPU) {
    return lab_errorf(TRITONSERVER_ERROR_UNSUPPORTED, "%s: output buffer in GPU memory", BACKEND);
  }
  if (bytes > 0) memcpy(buffer, out + slot->offset, bytes);
  return NULL;
}

TRITONSERVER_Error* TRITONBACKEND_ModelInstanceExecute(
    TRITONBACKEND_ModelInstance* instance, TRITONBACKEND_Request** requests, uint32_t count) {
  uint64_t exec_start = lab_now_ns();
  /* Until a response exists, returning an error hands the requests back to Triton. */
  TRITONBACKEND_Model* model_handle = NULL;
  ScaleModel* model = NULL;
  LAB_RETURN_IF_ERROR(TRITONBACKEND_ModelInstanceModel(instance, &model_handle));
  LAB_RETURN_IF_ERROR(TRITONBACKEND_ModelState(model_handle, (void**)&model));
  Slot* slots = calloc(count ? count : 1, sizeof *slots);
  if (slots == NULL) return lab_errorf(TRITONSERVER_ERROR_INTERNAL, "%s: out of memory", BACKEND);

  /* From here on every request gets a response (or an error response) and a release. */
  uint64_t total = check_requests(model, requests, count, slots);
  float* in = malloc((total ? total : 1) * sizeof(float));
  float* out = malloc((total ? total : 1) * sizeof(float));
  for (uint32_t i = 0; i < count; ++i) { /* step 2: gather */
    if (!slots[i].ok) continue;
    TRITONSERVER_Error* err = (in && out) ? lab_gather_input(BACKEND, &slots[i].input, in + slots[i].offset)
                                          : lab_errorf(TRITONSERVER_ERROR_INTERNAL, "%s: out of memory", BACKEND);
    if (err != NULL) {
      lab_send_error(slots[i].response, err);
      slots[i].response = NULL;
      slots[i].ok = false;
    }
  }

  uint64_t compute_start = lab_now_ns();
  for (uint32_t i = 0; i < count; ++i) { /* the whole batch, one loop over contiguous floats */
    if (!slots[i].ok) continue;
    const float* src = in + slots[i].offset;
    float* dst = out + slots[i].offset;
    for (uint64_t k = 0; k < slots[i].input.elements; ++k) dst[k] = src[k] * model->factor;
  }
  uint64_t compute_end = lab_now_ns();

  uint64_t batch_size = 0;
  for (uint32_t i = 0; i < count; ++i) { /* step 3: scatter and send */
    if (!slots[i].ok) continue;
    TRITONSERVER_Error* err = send_output(&slots[i], out);
    if (err != NULL) {
      lab_send_error(slots[i].response, err);
      slots[i].response = NULL;
      slots[i].ok = false;
      continue;
    }
    err = TRITONBACKEND_ResponseSend(slots[i].response, TRITONSERVER_RESPONSE_COMPLETE_FINAL, NULL);
    slots[i].response = NULL; /* Triton's now, whatever ResponseSend returns */
    if (err != NULL) {
      /* tritonbackend.h: ResponseSend "transfers ownership of the response object to Triton. The
       * caller must not access or delete the response object after calling this function." That
       * holds on failure too: core wraps the response in a unique_ptr before sending, so it is
       * already freed here and a ResponseDelete would free it twice. Only the error is ours. */
      LAB_LOG(TRITONSERVER_LOG_ERROR, "%s: send failed: %s", BACKEND, TRITONSERVER_ErrorMessage(err));
      TRITONSERVER_ErrorDelete(err);
      slots[i].ok = false;
      continue;
    }
    batch_size += batch_items(model, &slots[i].input);
  }
  uint64_t exec_end = lab_now_ns();

  /* Step 4: statistics before release (a released request must not be touched again). */
  for (uint32_t i = 0; i < count; ++i) {
    lab_finish_request(instance, requests[i], slots[i].ok, exec_start, compute_start, compute_end, exec_end);
  }
  if (batch_size > 0) {
    TRITONSERVER_Error* err = TRITONBACKEND_ModelInstanceReportBatchStatistics(
        instance, batch_size, exec_start, compute_start, compute_end, exec_end);
    if (err != NULL) {
      LAB_LOG(TRITONSERVER_LOG_ERROR, "%s: batch statistics: %s", BACKEND, TRITONSERVER_ErrorMessage(err));
      TRITONSERVER_ErrorDelete(err);
    }
  }
  free(in);
  free(out);
  free(slots);
  return NULL; /* every request was answered and released: nothing for Triton to clean up */
}
