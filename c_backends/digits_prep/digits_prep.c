/*
 * digits_prep.c - backend "digits_prep": real preprocessing in C for the digits pipeline.
 *
 * IMAGE  UINT8 [batch, 8, 8], values 0..16 (scikit-learn's 8x8 digits)
 *   ->  PIXELS FP32 [batch, 64] = IMAGE / 8 - 1   (range [-1, 1], what digits_onnx expects)
 *
 * It replaces the Python model digits_preprocess in the ensemble digits_ensemble_c: no stub
 * process, no shared-memory hop, the conversion runs inside the server. A pixel outside 0..16
 * means the caller sent something that is not a digits image: that request gets an error
 * response naming the first bad pixel, and the other requests of the batch are still served.
 *
 * Build: lab_backends.cbackend.build("c_backends/digits_prep/digits_prep.c", "digits_prep")
 */
#include "lab_backend_util.h"

#define BACKEND "digits_prep"
#define SIDE 8
#define PIXELS (SIDE * SIDE)
#define MAX_VALUE 16

TRITONSERVER_Error* TRITONBACKEND_Initialize(TRITONBACKEND_Backend* backend) {
  (void)backend;
  return lab_check_api_version(BACKEND);
}

/* Check IMAGE's shape [batch, 8, 8] and its values; NULL when the request is fine. */
static TRITONSERVER_Error* check_image(const LabInput* image, const uint8_t* data) {
  if (image->dims != 3 || image->shape[1] != SIDE || image->shape[2] != SIDE) {
    return lab_errorf(TRITONSERVER_ERROR_INVALID_ARG, "%s: IMAGE must be [batch, 8, 8]", BACKEND);
  }
  for (uint64_t k = 0; k < image->elements; ++k) {
    if (data[k] > MAX_VALUE) {
      return lab_errorf(TRITONSERVER_ERROR_INVALID_ARG,
                        "%s: IMAGE values must be 0..16 (8x8 digits), got %u in image %llu at "
                        "pixel %llu; scale your image to 0..16 first",
                        BACKEND, data[k], (unsigned long long)(k / PIXELS),
                        (unsigned long long)(k % PIXELS));
    }
  }
  return NULL;
}

/* Convert one request into its response's PIXELS output. */
static TRITONSERVER_Error* convert(TRITONBACKEND_Request* request, TRITONBACKEND_Response* response,
                                   uint64_t* batch) {
  LabInput image;
  LAB_RETURN_IF_ERROR(lab_get_input(BACKEND, request, "IMAGE", TRITONSERVER_TYPE_UINT8, &image));
  uint8_t* data = malloc(image.byte_size ? image.byte_size : 1);
  if (data == NULL) return lab_errorf(TRITONSERVER_ERROR_INTERNAL, "%s: out of memory", BACKEND);
  TRITONSERVER_Error* err = lab_gather_input(BACKEND, &image, data);
  if (err == NULL) err = check_image(&image, data);

  TRITONBACKEND_Output* output = NULL;
  float* pixels = NULL;
  const int64_t shape[2] = {image.dims > 0 ? image.shape[0] : 0, PIXELS};
  if (err == NULL) {
    err = TRITONBACKEND_ResponseOutput(response, &output, "PIXELS", TRITONSERVER_TYPE_FP32, shape, 2);
  }
  if (err == NULL) {
    TRITONSERVER_MemoryType mem = TRITONSERVER_MEMORY_CPU;
    int64_t mem_id = 0;
    err = TRITONBACKEND_OutputBuffer(output, (void**)&pixels, image.elements * sizeof(float), &mem, &mem_id);
    if (err == NULL && mem == TRITONSERVER_MEMORY_GPU) {
      err = lab_errorf(TRITONSERVER_ERROR_UNSUPPORTED, "%s: output buffer in GPU memory", BACKEND);
    }
  }
  if (err == NULL) {
    /* The agreed normalization: float32(IMAGE) / 8 - 1 (exact in float32 for 0..16). */
    for (uint64_t k = 0; k < image.elements; ++k) pixels[k] = (float)data[k] / 8.0f - 1.0f;
    *batch = (uint64_t)shape[0];
  }
  free(data);
  return err;
}

TRITONSERVER_Error* TRITONBACKEND_ModelInstanceExecute(
    TRITONBACKEND_ModelInstance* instance, TRITONBACKEND_Request** requests, uint32_t count) {
  uint64_t exec_start = lab_now_ns();
  bool* ok = calloc(count ? count : 1, sizeof *ok);
  if (ok == NULL) return lab_errorf(TRITONSERVER_ERROR_INTERNAL, "%s: out of memory", BACKEND);
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
    uint64_t batch = 0;
    err = convert(requests[i], response, &batch);
    if (err != NULL) {
      lab_send_error(response, err); /* a response that got no output yet carries the error */
      continue;
    }
    err = TRITONBACKEND_ResponseSend(response, TRITONSERVER_RESPONSE_COMPLETE_FINAL, NULL);
    if (err != NULL) {
      /* The response is Triton's even when ResponseSend fails (tritonbackend.h: "The caller must
       * not access or delete the response object after calling this function"; core frees it
       * through a unique_ptr on every path). Deleting it here would be a double free: log, free
       * the error, move on. */
      LAB_LOG(TRITONSERVER_LOG_ERROR, "%s: send failed: %s", BACKEND, TRITONSERVER_ErrorMessage(err));
      TRITONSERVER_ErrorDelete(err);
      continue;
    }
    ok[i] = true;
    batch_size += batch;
  }
  uint64_t compute_end = lab_now_ns();
  uint64_t exec_end = compute_end;
  for (uint32_t i = 0; i < count; ++i) {
    lab_finish_request(instance, requests[i], ok[i], exec_start, compute_start, compute_end, exec_end);
  }
  if (batch_size > 0) {
    TRITONSERVER_Error* err = TRITONBACKEND_ModelInstanceReportBatchStatistics(
        instance, batch_size, exec_start, compute_start, compute_end, exec_end);
    if (err != NULL) TRITONSERVER_ErrorDelete(err);
  }
  free(ok);
  return NULL;
}
