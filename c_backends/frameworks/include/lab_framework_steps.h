/*
 * lab_framework_steps.h - the steps every C++ framework backend of this workbench takes the same way
 * (lab_libtorch.cc, lab_executorch.cc, and lab_kvcache.cc for what it shares): the Triton side of a
 * backend that does not depend on the framework. Header-only (inline, in namespace lab_fw), so each
 * backend stays one library built from its own sources; it compiles as C++17 (lab_executorch) and
 * C++20 (lab_libtorch, lab_kvcache) under -Wall -Wextra -Werror.
 *
 *   helpers:   now_ns (statistics' clock), one_line, make_error, LAB_LOG, RETURN_IF_ERROR, drop;
 *   load:      check_api_version, read_model_config (name, folder, version, config JSON), parameter,
 *              model_file, read_max_batch_size, delete_model_state, model_state_of,
 *              delete_instance_state, instance_state_of;
 *   execute:   Slot (one request's bookkeeping), fail, new_responses (step 0), send_rows (the scatter's
 *              send), fail_unanswered, report (step 5: statistics, release, batch statistics).
 * What a backend does its own way stays in it (its types, its check, its gather, its scatter loop).
 */
#ifndef LAB_FRAMEWORK_STEPS_H
#define LAB_FRAMEWORK_STEPS_H

#include <time.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

extern "C" {
#include "lab_triton.h"
}
#include "../lab_tensorflow/config_json.h" /* the config's JSON, read in plain C */

namespace lab_fw {

/* ------------------------------------------------------------------ small helpers */

inline uint64_t now_ns() { /* Triton's statistics use CLOCK_MONOTONIC nanoseconds */
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

/* One line: a framework's messages carry newlines (a TorchScript traceback); a load error must read as
 * one line in the server log and in the repository index. */
inline std::string one_line(std::string text, size_t limit = 600) {
  for (char& c : text) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  if (text.size() > limit) text = text.substr(0, limit) + " ...";
  return text;
}

/* A Triton error of one line (at most 2,000 characters). */
inline TRITONSERVER_Error* make_error(TRITONSERVER_Error_Code code, const std::string& message) {
  return TRITONSERVER_ErrorNew(code, one_line(message, 2000).c_str());
}

/* An error nobody reads further (a failed delete, a log call): freed, as every TRITONSERVER_Error must be. */
inline void drop(TRITONSERVER_Error* err) {
  if (err != nullptr) TRITONSERVER_ErrorDelete(err);
}

/* Into Triton's log, at the caller's file and line (LAB_LOG). */
inline void log_message(TRITONSERVER_LogLevel level, const char* file, int line, const std::string& message) {
  drop(TRITONSERVER_LogMessage(level, file, line, message.c_str()));
}

}  // namespace lab_fw

#define LAB_LOG(level, message) lab_fw::log_message((level), __FILE__, __LINE__, (message))

#define RETURN_IF_ERROR(expr)                   \
  do {                                          \
    TRITONSERVER_Error* lab_err__ = (expr);     \
    if (lab_err__ != nullptr) return lab_err__; \
  } while (0)

namespace lab_fw {

/* ------------------------------------------------------------------ load */

/* TRITONBACKEND_Initialize: the server's backend API (TRITONBACKEND_ApiVersion) must be the major
 * version this was written against, with at least its minor (backend's recommended.cc does the same). */
inline TRITONSERVER_Error* check_api_version(const char* backend, uint32_t major, uint32_t minor) {
  if (major != LAB_TRITONBACKEND_API_MAJOR || minor < LAB_TRITONBACKEND_API_MINOR) {
    return make_error(TRITONSERVER_ERROR_UNSUPPORTED, std::string(backend) + ": the server's backend API is " +
                      std::to_string(major) + "." + std::to_string(minor) + "; this backend needs 1.x with x >= 19");
  }
  return nullptr;
}

/* What ModelInitialize reads first: the model's name, version and folder, and its config as JSON
 * (TRITONBACKEND_ModelConfig, version 1). */
struct ModelConfig {
  std::string name;
  std::string folder;      /* the model's folder in the repository */
  std::string config_file; /* <folder>/config.pbtxt, named in load errors */
  uint64_t version = 0;
  std::string json;        /* NUL-terminated here (the serialized message is not) */
};

inline TRITONSERVER_Error* read_model_config(TRITONBACKEND_Model* model, ModelConfig* c) {
  const char* name = nullptr;
  const char* folder = nullptr;
  TRITONBACKEND_ArtifactType artifact = TRITONBACKEND_ARTIFACT_FILESYSTEM;
  RETURN_IF_ERROR(TRITONBACKEND_ModelName(model, &name));
  RETURN_IF_ERROR(TRITONBACKEND_ModelVersion(model, &c->version));
  RETURN_IF_ERROR(TRITONBACKEND_ModelRepository(model, &artifact, &folder));
  c->name = name;
  c->folder = folder;
  c->config_file = c->folder + "/config.pbtxt";

  TRITONSERVER_Message* message = nullptr;
  RETURN_IF_ERROR(TRITONBACKEND_ModelConfig(model, 1, &message));
  const char* base = nullptr;
  size_t size = 0;
  TRITONSERVER_Error* err = TRITONSERVER_MessageSerializeToJson(message, &base, &size);
  c->json = err == nullptr ? std::string(base, size) : std::string(); /* copied before the delete */
  drop(TRITONSERVER_MessageDelete(message));
  return err;
}

/* parameters { key: "KEY" value { string_value: "..." } }: {"parameters":{"KEY":{"string_value":"..."}}}. */
inline bool parameter(const char* json, const char* key, std::string* out) {
  char value[256];
  const char* entry = json_member(json_member(json, "parameters"), key);
  if (!json_string(json_member(entry, "string_value"), value, sizeof value)) return false;
  *out = value;
  return true;
}

/* <folder>/<version>/<default_model_filename>, `fallback` when the config names none (Triton's own
 * backends read default_model_filename the same way). */
inline std::string model_file(const ModelConfig& c, const char* fallback) {
  char filename[256] = "";
  if (!json_string(json_member(c.json.c_str(), "default_model_filename"), filename, sizeof filename) ||
      !filename[0]) {
    std::snprintf(filename, sizeof filename, "%s", fallback);
  }
  return c.folder + "/" + std::to_string(c.version) + "/" + filename;
}

/* max_batch_size >= 1: the gather stacks requests along the first dimension, which a config with
 * max_batch_size 0 does not have (its dims are the whole tensor). `where` starts the message. */
inline TRITONSERVER_Error* read_max_batch_size(const ModelConfig& c, const std::string& where, int64_t* out) {
  if (!json_int(json_member(c.json.c_str(), "max_batch_size"), out) || *out < 1) {
    return make_error(TRITONSERVER_ERROR_INVALID_ARG, where + "max_batch_size is 0, but this backend gathers "
                      "requests along the first dimension; set max_batch_size: 1 or more in " + c.config_file);
  }
  return nullptr;
}

/* ModelFinalize: at unload, after every instance, and after a failed load too (core
 * src/backend_model.cc L169-175, L983-987 at r24.10), when the state is NULL: deleting NULL is nothing. */
template <typename Model>
TRITONSERVER_Error* delete_model_state(TRITONBACKEND_Model* model) {
  void* state = nullptr;
  RETURN_IF_ERROR(TRITONBACKEND_ModelState(model, &state));
  delete static_cast<Model*>(state);
  return nullptr;
}

/* ModelInstanceInitialize: the state its model's ModelInitialize set (instances load after their model). */
template <typename Model>
TRITONSERVER_Error* model_state_of(TRITONBACKEND_ModelInstance* instance, Model** out) {
  TRITONBACKEND_Model* model = nullptr;
  void* state = nullptr;
  RETURN_IF_ERROR(TRITONBACKEND_ModelInstanceModel(instance, &model));
  RETURN_IF_ERROR(TRITONBACKEND_ModelState(model, &state));
  *out = static_cast<Model*>(state);
  return nullptr;
}

/* ModelInstanceFinalize: at unload, and after a failed ModelInstanceInitialize too (core
 * src/backend_model_instance.cc L305-311, the destructor L209-214 at r24.10), when the state is NULL. */
template <typename Instance>
TRITONSERVER_Error* delete_instance_state(TRITONBACKEND_ModelInstance* instance) {
  void* state = nullptr;
  RETURN_IF_ERROR(TRITONBACKEND_ModelInstanceState(instance, &state));
  delete static_cast<Instance*>(state);
  return nullptr;
}

/* ModelInstanceExecute: the state ModelInstanceInitialize set (Execute is never called without one). */
template <typename Instance>
TRITONSERVER_Error* instance_state_of(TRITONBACKEND_ModelInstance* instance, Instance** out) {
  void* state = nullptr;
  RETURN_IF_ERROR(TRITONBACKEND_ModelInstanceState(instance, &state));
  *out = static_cast<Instance*>(state);
  return nullptr;
}

/* ------------------------------------------------------------------ execute */

/* Per request inside one Execute call (a backend may add its own fields). */
struct Slot {
  TRITONBACKEND_Response* response = nullptr; /* nullptr once answered (or never created) */
  TRITONBACKEND_Input* input = nullptr;
  uint64_t bytes = 0;
  uint32_t buffers = 0;
  int64_t rows = 0;   /* this request's own batch size: the first dimension of its input */
  int64_t offset = 0; /* its first row in the gathered batch */
  bool ok = false;
};

/* Answer one request with an error now; its batch-mates go on (recommended.cc's
 * RESPOND_AND_SET_NULL_IF_ERROR). ResponseSend takes the response, never the error. */
inline void fail(Slot* s, TRITONSERVER_Error* err) {
  if (s->response != nullptr) {
    TRITONSERVER_Error* sent = TRITONBACKEND_ResponseSend(s->response, TRITONSERVER_RESPONSE_COMPLETE_FINAL, err);
    if (sent != nullptr) {
      LAB_LOG(TRITONSERVER_LOG_ERROR, std::string("failed to send an error response: ") + TRITONSERVER_ErrorMessage(sent));
      TRITONSERVER_ErrorDelete(sent);
    }
  }
  TRITONSERVER_ErrorDelete(err);
  s->response = nullptr;
  s->ok = false;
}

/* Step 0, RESPONSES: one per request, all made before anything else. If one cannot be made, none
 * is kept and Execute returns the error: Triton still owns the requests then, and answers each
 * with it (backend examples/backends/recommended/src/recommended.cc L509-515 at r24.10). Made one
 * by one during the work, a failed one would leave its request released with no response at all. */
template <typename S>
TRITONSERVER_Error* new_responses(TRITONBACKEND_Request** requests, uint32_t count, std::vector<S>& slots) {
  for (uint32_t i = 0; i < count; ++i) {
    TRITONSERVER_Error* err = TRITONBACKEND_ResponseNew(&slots[i].response, requests[i]);
    if (err == nullptr) continue;
    for (uint32_t j = 0; j < i; ++j) { /* not sent: still ours to delete */
      drop(TRITONBACKEND_ResponseDelete(slots[j].response));
      slots[j].response = nullptr;
    }
    return err;
  }
  return nullptr;
}

/* Step 4, SCATTER, for one request: its output `name` of `type` and `shape` ([its rows, dims...]) in its
 * own response, `bytes` copied from `rows` (its rows of the result), then the response sent FINAL. */
inline void send_rows(Slot* s, const char* backend, const std::string& name, TRITONSERVER_DataType type,
                      const std::vector<int64_t>& shape, const char* rows, uint64_t bytes) {
  TRITONBACKEND_Output* output = nullptr;
  void* buffer = nullptr;
  TRITONSERVER_MemoryType mem = TRITONSERVER_MEMORY_CPU;
  int64_t mem_id = 0;
  TRITONSERVER_Error* err = TRITONBACKEND_ResponseOutput(s->response, &output, name.c_str(), type, shape.data(),
                                                         static_cast<uint32_t>(shape.size()));
  if (err == nullptr) err = TRITONBACKEND_OutputBuffer(output, &buffer, bytes, &mem, &mem_id);
  if (err == nullptr && mem == TRITONSERVER_MEMORY_GPU) {
    err = make_error(TRITONSERVER_ERROR_UNSUPPORTED, std::string(backend) + ": output buffer in GPU memory");
  }
  if (err != nullptr) {
    fail(s, err);
    return;
  }
  std::memcpy(buffer, rows, bytes);
  err = TRITONBACKEND_ResponseSend(s->response, TRITONSERVER_RESPONSE_COMPLETE_FINAL, nullptr);
  s->response = nullptr; /* Triton's now, even if the send failed (lab_triton.h, ResponseSend) */
  if (err != nullptr) {
    LAB_LOG(TRITONSERVER_LOG_ERROR, std::string(backend) + ": send failed: " + TRITONSERVER_ErrorMessage(err));
    TRITONSERVER_ErrorDelete(err);
    s->ok = false;
  }
}

/* Before the report: nothing may stay unanswered (once responses exist, every request gets one:
 * recommended.cc at r24.10). */
template <typename S>
void fail_unanswered(std::vector<S>& slots, const std::string& message) {
  for (S& s : slots) {
    if (s.response != nullptr) fail(&s, make_error(TRITONSERVER_ERROR_INTERNAL, message));
  }
}

/* Step 5, REPORT and RELEASE: per-request statistics before each release, then one batch record
 * with the rows that were answered: inference_count grows with the successes' rows only (core
 * src/infer_stats.cc L104-L111 at r24.10); the batch record feeds execution_count and batch_stats
 * (L386-L425). stamps: exec start, compute start (after check + gather), compute end (after the
 * framework's run), exec end (after the scatter). */
template <typename S>
void report(TRITONBACKEND_ModelInstance* instance, TRITONBACKEND_Request** requests, const std::vector<S>& slots,
            const uint64_t stamps[4]) {
  uint64_t rows = 0;
  for (size_t i = 0; i < slots.size(); ++i) {
    TRITONSERVER_Error* err = TRITONBACKEND_ModelInstanceReportStatistics(instance, requests[i], slots[i].ok, stamps[0],
                                                                          stamps[1], stamps[2], stamps[3]);
    if (err != nullptr) {
      LAB_LOG(TRITONSERVER_LOG_ERROR, std::string("statistics: ") + TRITONSERVER_ErrorMessage(err));
      TRITONSERVER_ErrorDelete(err);
    }
    err = TRITONBACKEND_RequestRelease(requests[i], TRITONSERVER_REQUEST_RELEASE_ALL);
    if (err != nullptr) {
      LAB_LOG(TRITONSERVER_LOG_ERROR, std::string("release: ") + TRITONSERVER_ErrorMessage(err));
      TRITONSERVER_ErrorDelete(err);
    }
    if (slots[i].ok) rows += static_cast<uint64_t>(slots[i].rows);
  }
  if (rows == 0) return;
  TRITONSERVER_Error* err = TRITONBACKEND_ModelInstanceReportBatchStatistics(instance, rows, stamps[0], stamps[1],
                                                                             stamps[2], stamps[3]);
  if (err != nullptr) {
    LAB_LOG(TRITONSERVER_LOG_ERROR, std::string("batch statistics: ") + TRITONSERVER_ErrorMessage(err));
    TRITONSERVER_ErrorDelete(err);
  }
}

}  // namespace lab_fw

#endif /* LAB_FRAMEWORK_STEPS_H */
