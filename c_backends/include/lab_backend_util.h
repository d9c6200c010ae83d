/*
 * lab_backend_util.h - small helpers shared by the workbench's C backends (header-only).
 *
 * Why: every backend repeats the same chores - check the API version, turn a printf-style message
 * into a TRITONSERVER_Error, read a config parameter, copy an input that may arrive in several
 * buffers into one contiguous block, answer a request with an error. Keeping them here keeps
 * scale.c and digits_prep.c about their one job.
 */
#ifndef LAB_BACKEND_UTIL_H
#define LAB_BACKEND_UTIL_H

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "lab_triton.h"

#define LAB_UNUSED __attribute__((unused))

/* Triton's statistics and traces use CLOCK_MONOTONIC nanoseconds. */
static LAB_UNUSED uint64_t lab_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* A new error with a formatted message; the caller owns it. */
static LAB_UNUSED __attribute__((format(printf, 2, 3))) TRITONSERVER_Error* lab_errorf(
    TRITONSERVER_Error_Code code, const char* fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return TRITONSERVER_ErrorNew(code, msg);
}

/* Log through the server's log (so messages land in tritonserver.log with the others). */
static LAB_UNUSED __attribute__((format(printf, 4, 5))) void lab_log(
    TRITONSERVER_LogLevel level, const char* file, int line, const char* fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  TRITONSERVER_Error* err = TRITONSERVER_LogMessage(level, file, line, msg);
  if (err != NULL) TRITONSERVER_ErrorDelete(err);
}
#define LAB_LOG(level, ...) lab_log((level), __FILE__, __LINE__, __VA_ARGS__)

/* Return early with the error if a call failed (the error is passed up, still owned). */
#define LAB_RETURN_IF_ERROR(expr)            \
  do {                                       \
    TRITONSERVER_Error* lab_err__ = (expr);  \
    if (lab_err__ != NULL) return lab_err__; \
  } while (0)

/* Refuse a server whose backend API is older than, or incompatible with, the one we were written
 * against: same major, minor at least ours. */
static LAB_UNUSED TRITONSERVER_Error* lab_check_api_version(const char* backend_name) {
  uint32_t major = 0, minor = 0;
  LAB_RETURN_IF_ERROR(TRITONBACKEND_ApiVersion(&major, &minor));
  LAB_LOG(TRITONSERVER_LOG_INFO, "%s: Triton backend API %u.%u (built for %u.%u)", backend_name,
          major, minor, LAB_TRITONBACKEND_API_MAJOR, LAB_TRITONBACKEND_API_MINOR);
  if (major != LAB_TRITONBACKEND_API_MAJOR || minor < LAB_TRITONBACKEND_API_MINOR) {
    return lab_errorf(TRITONSERVER_ERROR_UNSUPPORTED,
                      "%s: the server's backend API is %u.%u; this backend needs %u.x with x >= %u",
                      backend_name, major, minor, LAB_TRITONBACKEND_API_MAJOR,
                      LAB_TRITONBACKEND_API_MINOR);
  }
  return NULL;
}

/* The model config as NUL-terminated compact JSON, in a malloc'd copy the caller frees. */
static LAB_UNUSED TRITONSERVER_Error* lab_model_config_json(TRITONBACKEND_Model* model, char** out) {
  *out = NULL;
  TRITONSERVER_Message* message = NULL;
  LAB_RETURN_IF_ERROR(TRITONBACKEND_ModelConfig(model, 1, &message));
  const char* json = NULL;
  size_t size = 0;
  TRITONSERVER_Error* err = TRITONSERVER_MessageSerializeToJson(message, &json, &size);
  if (err == NULL) {
    *out = malloc(size + 1); /* the message's own text is not NUL-terminated */
    if (*out == NULL) {
      err = lab_errorf(TRITONSERVER_ERROR_INTERNAL, "out of memory reading the model config");
    } else {
      memcpy(*out, json, size);
      (*out)[size] = '\0';
    }
  }
  TRITONSERVER_Error* del = TRITONSERVER_MessageDelete(message);
  if (del != NULL) TRITONSERVER_ErrorDelete(del);
  return err;
}

/*
 * Find parameters { key: "<key>" value { string_value: "..." } } in the config JSON, which has
 * the compact shape "parameters":{"<key>":{"string_value":"..."}}: a tiny scan is enough, no JSON
 * library needed. Returns false when the parameter is absent; an over-long value is an error.
 */
static LAB_UNUSED TRITONSERVER_Error* lab_json_parameter(
    const char* json, const char* key, char* out, size_t out_size, bool* found) {
  *found = false;
  char quoted[128];
  snprintf(quoted, sizeof quoted, "\"%s\"", key);
  const char* params = strstr(json, "\"parameters\"");
  const char* at = params ? strstr(params, quoted) : NULL;
  const char* value = at ? strstr(at, "\"string_value\"") : NULL;
  if (value == NULL) return NULL;
  value = strchr(value + strlen("\"string_value\""), '"');
  const char* end = value ? strchr(value + 1, '"') : NULL;
  if (end == NULL || (size_t)(end - value - 1) >= out_size) {
    return lab_errorf(TRITONSERVER_ERROR_INVALID_ARG,
                      "config parameter '%s' is malformed or longer than %zu characters", key,
                      out_size - 1);
  }
  memcpy(out, value + 1, (size_t)(end - value - 1));
  out[end - value - 1] = '\0';
  *found = true;
  return NULL;
}

/* A top-level integer field such as "max_batch_size":8 (0 when absent). */
static LAB_UNUSED long long lab_json_int(const char* json, const char* field) {
  char quoted[128];
  snprintf(quoted, sizeof quoted, "\"%s\":", field);
  const char* at = strstr(json, quoted);
  return at ? strtoll(at + strlen(quoted), NULL, 10) : 0;
}

/* Bytes per element for the fixed-size types we handle; 0 for BYTES/INVALID. */
static LAB_UNUSED uint64_t lab_dtype_size(TRITONSERVER_DataType dtype) {
  switch (dtype) {
    case TRITONSERVER_TYPE_BOOL: case TRITONSERVER_TYPE_UINT8: case TRITONSERVER_TYPE_INT8: return 1;
    case TRITONSERVER_TYPE_UINT16: case TRITONSERVER_TYPE_INT16: case TRITONSERVER_TYPE_FP16:
    case TRITONSERVER_TYPE_BF16: return 2;
    case TRITONSERVER_TYPE_UINT32: case TRITONSERVER_TYPE_INT32: case TRITONSERVER_TYPE_FP32: return 4;
    case TRITONSERVER_TYPE_UINT64: case TRITONSERVER_TYPE_INT64: case TRITONSERVER_TYPE_FP64: return 8;
    default: return 0;
  }
}

/* What we know about one request's input after checking it. */
typedef struct {
  TRITONBACKEND_Input* input;
  const int64_t* shape; /* valid until the request is released */
  uint32_t dims;
  uint64_t elements;
  uint64_t byte_size;
  uint32_t buffers;
} LabInput;

/* Find input 'name' of a request and check its type and that its bytes match its shape. */
static LAB_UNUSED TRITONSERVER_Error* lab_get_input(
    const char* backend_name, TRITONBACKEND_Request* request, const char* name,
    TRITONSERVER_DataType want, LabInput* info) {
  TRITONSERVER_Error* err = TRITONBACKEND_RequestInput(request, name, &info->input);
  if (err != NULL) {
    TRITONSERVER_ErrorDelete(err);
    return lab_errorf(TRITONSERVER_ERROR_INVALID_ARG, "%s: the request has no input '%s'",
                      backend_name, name);
  }
  TRITONSERVER_DataType dtype = TRITONSERVER_TYPE_INVALID;
  LAB_RETURN_IF_ERROR(TRITONBACKEND_InputProperties(info->input, NULL, &dtype, &info->shape,
                                                    &info->dims, &info->byte_size, &info->buffers));
  if (dtype != want) {
    return lab_errorf(TRITONSERVER_ERROR_INVALID_ARG,
                      "%s: input '%s' must be %s, got %s; send a %s array", backend_name, name,
                      TRITONSERVER_DataTypeString(want), TRITONSERVER_DataTypeString(dtype),
                      TRITONSERVER_DataTypeString(want));
  }
  info->elements = 1;
  for (uint32_t d = 0; d < info->dims; ++d) {
    if (info->shape[d] < 0) {
      return lab_errorf(TRITONSERVER_ERROR_INVALID_ARG, "%s: input '%s' has a negative dimension",
                        backend_name, name);
    }
    /* A shape such as [1, 2^62+1] wraps to a small product that matches a 4-byte body; trusting
     * it later reads far past the buffer (SIGSEGV, the whole server dies). Check every step. */
    if (__builtin_mul_overflow(info->elements, (uint64_t)info->shape[d], &info->elements)) {
      return lab_errorf(TRITONSERVER_ERROR_INVALID_ARG,
                        "%s: input '%s' has a shape whose element count overflows 64 bits; send "
                        "a shape that matches the data", backend_name, name);
    }
  }
  uint64_t needed = 0;
  if (__builtin_mul_overflow(info->elements, lab_dtype_size(want), &needed)) {
    return lab_errorf(TRITONSERVER_ERROR_INVALID_ARG,
                      "%s: input '%s' has a shape whose byte size overflows 64 bits; send a shape "
                      "that matches the data", backend_name, name);
  }
  if (needed != info->byte_size) {
    return lab_errorf(TRITONSERVER_ERROR_INVALID_ARG,
                      "%s: input '%s' holds %llu bytes but its shape needs %llu", backend_name,
                      name, (unsigned long long)info->byte_size, (unsigned long long)needed);
  }
  return NULL;
}

/* Copy an input that may be split over several buffers into one contiguous block 'dst'
 * (info->byte_size bytes). Only CPU memory is accepted: this workbench has no GPU. */
static LAB_UNUSED TRITONSERVER_Error* lab_gather_input(
    const char* backend_name, const LabInput* info, void* dst) {
  uint64_t copied = 0;
  for (uint32_t b = 0; b < info->buffers; ++b) {
    const void* buffer = NULL;
    uint64_t size = 0;
    TRITONSERVER_MemoryType mem = TRITONSERVER_MEMORY_CPU;
    int64_t mem_id = 0;
    LAB_RETURN_IF_ERROR(TRITONBACKEND_InputBuffer(info->input, b, &buffer, &size, &mem, &mem_id));
    if (mem == TRITONSERVER_MEMORY_GPU) {
      return lab_errorf(TRITONSERVER_ERROR_UNSUPPORTED, "%s: input arrived in GPU memory; this "
                        "backend runs on CPU only", backend_name);
    }
    if (copied + size > info->byte_size) {
      return lab_errorf(TRITONSERVER_ERROR_INTERNAL, "%s: input buffers exceed the declared size",
                        backend_name);
    }
    memcpy((char*)dst + copied, buffer, size);
    copied += size;
  }
  if (copied != info->byte_size) {
    return lab_errorf(TRITONSERVER_ERROR_INTERNAL, "%s: input buffers hold %llu of %llu bytes",
                      backend_name, (unsigned long long)copied,
                      (unsigned long long)info->byte_size);
  }
  return NULL;
}

/* Answer a request with an error. The response is taken by the server; the error stays ours,
 * so it is deleted here. */
static LAB_UNUSED void lab_send_error(TRITONBACKEND_Response* response, TRITONSERVER_Error* error) {
  if (response != NULL) {
    TRITONSERVER_Error* send = TRITONBACKEND_ResponseSend(response, TRITONSERVER_RESPONSE_COMPLETE_FINAL, error);
    if (send != NULL) {
      LAB_LOG(TRITONSERVER_LOG_ERROR, "failed to send an error response: %s", TRITONSERVER_ErrorMessage(send));
      TRITONSERVER_ErrorDelete(send);
    }
  }
  if (error != NULL) TRITONSERVER_ErrorDelete(error);
}

/* Report this request's statistics, then release it: the order the API requires. */
static LAB_UNUSED void lab_finish_request(
    TRITONBACKEND_ModelInstance* instance, TRITONBACKEND_Request* request, bool success,
    uint64_t exec_start, uint64_t compute_start, uint64_t compute_end, uint64_t exec_end) {
  TRITONSERVER_Error* err = TRITONBACKEND_ModelInstanceReportStatistics(
      instance, request, success, exec_start, compute_start, compute_end, exec_end);
  if (err != NULL) {
    LAB_LOG(TRITONSERVER_LOG_ERROR, "failed to report statistics: %s", TRITONSERVER_ErrorMessage(err));
    TRITONSERVER_ErrorDelete(err);
  }
  err = TRITONBACKEND_RequestRelease(request, TRITONSERVER_REQUEST_RELEASE_ALL);
  if (err != NULL) {
    LAB_LOG(TRITONSERVER_LOG_ERROR, "failed to release a request: %s", TRITONSERVER_ErrorMessage(err));
    TRITONSERVER_ErrorDelete(err);
  }
}

#endif /* LAB_BACKEND_UTIL_H */
