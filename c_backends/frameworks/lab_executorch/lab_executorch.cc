/*
 * lab_executorch.cc - backend "lab_executorch": an ExecuTorch program (.pte) served in-process, in C++,
 * through ExecuTorch's runtime (the executorch wheel's lib/libexecutorch*.so and its headers).
 *
 * ExecuTorch, PyTorch's on-device runtime, has no Triton backend upstream; this one has the shape of
 * lab_libtorch.cc and of backend's examples/backends/recommended (src/recommended.cc at r24.10):
 *   load:     per model, the config (tensors, max_batch_size, file, XNNPACK_THREADS); per instance,
 *             the program bound to the runtime (lab_executorch_binding.cc: the method's own metadata
 *             checked against the config, its memory planned from that metadata, the method loaded);
 *   execute:  GATHER every request of the batch into the instance's input rows (each at its offset),
 *             RUN the method once, SCATTER each request's rows into its own response, report
 *             statistics, release.
 * The binding (lab_executorch_binding.h) is the part that is new for a new framework; this file is
 * what every framework backend shares, and speaks only to Triton and to the binding.
 *
 * Config: exactly one input and one output (a .pte's method takes tensors by position; the names are
 * the config's), max_batch_size >= 1 and at most the program's exported batch bound,
 * default_model_filename (default "model.pte"), XNNPACK_THREADS: "1" (default) runs the XNNPACK
 * delegate on the instance's own Triton thread (no pool: ExecuTorch's NoThreadPoolGuard during the
 * method's load, when XNNPACK creates its runtime, and during each execute, for kernels outside the
 * delegate); "0" uses ExecuTorch's process-wide pool (sized to the cores, the calling thread one of
 * them; shared by every instance that asks for it: tests/test_executorch_backend.py counts the threads
 * each adds). Other counts are refused, because ExecuTorch 1.5.1 has ONE pool per process and XNNPACK
 * takes it once per method load: libexecutorch_backend_xnnpack.so calls get_pthreadpool() at a single
 * place, just before xnn_create_runtime_v4, and its options (workspace_sharing_mode, weight_cache_enabled)
 * carry no thread count. libexecutorch_threadpool.so does export ThreadPool::_unsafe_reset_threadpool(n)
 * (nm -D), but its header (extension/threadpool/threadpool.h) is not in the wheel, upstream marks it
 * deprecated and not thread-safe, and it replaces the pool that the runtimes of models already loaded
 * hold: it could size the pool for the whole process, never per model, and only before any "0" model.
 *
 * Build: lab_backends.server.executorch_backend.build() (g++ -std=c++17 -Wall -Wextra -Werror,
 * ExecuTorch's headers as system headers with the definitions the wheel was built with, -Wl,-z,defs
 * against libtritonserver and ExecuTorch's libraries, copied next to this library: rpath $ORIGIN).
 */
#include <time.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <executorch/extension/threadpool/threadpool_guard.h>
#include <executorch/runtime/platform/runtime.h>

extern "C" {
#include "lab_triton.h"
}
#include "../lab_tensorflow/config_json.h" /* the config's tensor lists, read in plain C */
#include "lab_executorch_binding.h"

namespace {

constexpr const char* BACKEND = "lab_executorch";
constexpr const char* DEFAULT_FILENAME = "model.pte";

/* ------------------------------------------------------------------ small helpers */

uint64_t now_ns() { /* Triton's statistics use CLOCK_MONOTONIC nanoseconds */
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

TRITONSERVER_Error* make_error(TRITONSERVER_Error_Code code, const std::string& message) {
  return TRITONSERVER_ErrorNew(code, message.c_str());
}

void log_message(TRITONSERVER_LogLevel level, int line, const std::string& message) {
  TRITONSERVER_Error* err = TRITONSERVER_LogMessage(level, __FILE__, line, message.c_str());
  if (err != nullptr) TRITONSERVER_ErrorDelete(err);
}
#define LAB_LOG(level, message) log_message((level), __LINE__, (message))

#define RETURN_IF_ERROR(expr)                   \
  do {                                          \
    TRITONSERVER_Error* lab_err__ = (expr);     \
    if (lab_err__ != nullptr) return lab_err__; \
  } while (0)

/* ------------------------------------------------------------------ types: Triton <-> ExecuTorch */

struct Type {
  const char* config_name;
  TRITONSERVER_DataType triton;
  executorch::aten::ScalarType et;
};
constexpr Type TYPES[] = {
    {"TYPE_FP32", TRITONSERVER_TYPE_FP32, executorch::aten::ScalarType::Float},
    {"TYPE_FP64", TRITONSERVER_TYPE_FP64, executorch::aten::ScalarType::Double},
    {"TYPE_FP16", TRITONSERVER_TYPE_FP16, executorch::aten::ScalarType::Half},
    {"TYPE_INT8", TRITONSERVER_TYPE_INT8, executorch::aten::ScalarType::Char},
    {"TYPE_INT32", TRITONSERVER_TYPE_INT32, executorch::aten::ScalarType::Int},
    {"TYPE_INT64", TRITONSERVER_TYPE_INT64, executorch::aten::ScalarType::Long},
    {"TYPE_UINT8", TRITONSERVER_TYPE_UINT8, executorch::aten::ScalarType::Byte},
    {"TYPE_BOOL", TRITONSERVER_TYPE_BOOL, executorch::aten::ScalarType::Bool},
};

const Type* type_by_config_name(const char* name) {
  for (const Type& t : TYPES) {
    if (std::strcmp(t.config_name, name) == 0) return &t;
  }
  return nullptr;
}

/* ------------------------------------------------------------------ model: the config */

/* Per model: the binding's spec, the Triton types of its two tensors, the thread choice. */
struct EtModel {
  lab_et::ModelSpec spec;
  TRITONSERVER_DataType input_type = TRITONSERVER_TYPE_INVALID, output_type = TRITONSERVER_TYPE_INVALID;
  bool own_thread = true; /* XNNPACK_THREADS "1": no pool */

  std::string where() const { return std::string(BACKEND) + ": model '" + spec.model + "': "; }
};

/* parameters { key: "KEY" value { string_value: "..." } }: {"parameters":{"KEY":{"string_value":"..."}}}. */
bool parameter(const char* json, const char* key, std::string* out) {
  char value[256];
  const char* entry = json_member(json_member(json, "parameters"), key);
  if (!json_string(json_member(entry, "string_value"), value, sizeof value)) return false;
  *out = value;
  return true;
}

/* Exactly one input and one output, numeric, with fixed dims (a .pte's sizes are concrete). */
TRITONSERVER_Error* read_tensor(const EtModel& m, const char* json, const char* list, lab_et::ConfigTensor* t,
                                TRITONSERVER_DataType* triton) {
  size_t count = 0;
  const char* tensor = json_element(json_member(json, list), 0, &count);
  const std::string& file = m.spec.config_file;
  if (count != 1 || tensor == nullptr) {
    return make_error(TRITONSERVER_ERROR_INVALID_ARG, m.where() + file + " declares " + std::to_string(count) + " " +
                      list + " tensors; this backend serves exactly one input and one output: keep one in " + list +
                      "[ ... ] in " + file);
  }
  char name[128] = "", dtype[32] = "";
  if (!json_string(json_member(tensor, "name"), name, sizeof name) ||
      !json_string(json_member(tensor, "data_type"), dtype, sizeof dtype)) {
    return make_error(TRITONSERVER_ERROR_INVALID_ARG, m.where() + "the " + list + " in " + file +
                      " needs a name and a data_type");
  }
  const Type* type = type_by_config_name(dtype);
  if (type == nullptr) {
    return make_error(TRITONSERVER_ERROR_INVALID_ARG, m.where() + list + " '" + name + "' has data_type " + dtype +
                      ", which this backend does not move (numeric types only); fix data_type in " + file);
  }
  t->name = name;
  t->config_type = dtype;
  t->type = type->et;
  *triton = type->triton;
  const char* dims = json_member(tensor, "dims");
  size_t n = 0;
  json_element(dims, 0, &n);
  for (size_t d = 0; d < n; ++d) {
    size_t ignored = 0;
    int64_t v = 0;
    if (!json_int(json_element(dims, d, &ignored), &v) || v < 1) {
      return make_error(TRITONSERVER_ERROR_INVALID_ARG, m.where() + "dims of '" + name + "' in " + file +
                        " must be whole numbers >= 1: an ExecuTorch program's sizes after the batch are fixed");
    }
    t->dims.push_back(v);
  }
  return nullptr;
}

TRITONSERVER_Error* read_config(TRITONBACKEND_Model* model, EtModel* m) {
  const char* name = nullptr;
  const char* folder = nullptr;
  uint64_t version = 0;
  TRITONBACKEND_ArtifactType artifact = TRITONBACKEND_ARTIFACT_FILESYSTEM;
  RETURN_IF_ERROR(TRITONBACKEND_ModelName(model, &name));
  RETURN_IF_ERROR(TRITONBACKEND_ModelVersion(model, &version));
  RETURN_IF_ERROR(TRITONBACKEND_ModelRepository(model, &artifact, &folder));
  m->spec.model = name;
  m->spec.config_file = std::string(folder) + "/config.pbtxt";

  TRITONSERVER_Message* message = nullptr;
  RETURN_IF_ERROR(TRITONBACKEND_ModelConfig(model, 1, &message));
  const char* base = nullptr;
  size_t size = 0;
  TRITONSERVER_Error* err = TRITONSERVER_MessageSerializeToJson(message, &base, &size);
  std::string json = err == nullptr ? std::string(base, size) : std::string(); /* not NUL-terminated */
  TRITONSERVER_Error* deleted = TRITONSERVER_MessageDelete(message);
  if (deleted != nullptr) TRITONSERVER_ErrorDelete(deleted);
  RETURN_IF_ERROR(err);

  const char* j = json.c_str();
  if (!json_int(json_member(j, "max_batch_size"), &m->spec.max_batch_size) || m->spec.max_batch_size < 1) {
    return make_error(TRITONSERVER_ERROR_INVALID_ARG, m->where() + "max_batch_size is 0, but this backend gathers "
                      "requests along the first dimension; set max_batch_size: 1 or more in " + m->spec.config_file);
  }
  char filename[256] = "";
  if (!json_string(json_member(j, "default_model_filename"), filename, sizeof filename) || !filename[0]) {
    std::snprintf(filename, sizeof filename, "%s", DEFAULT_FILENAME);
  }
  m->spec.program_file = std::string(folder) + "/" + std::to_string(version) + "/" + filename;
  std::string threads;
  if (parameter(j, "XNNPACK_THREADS", &threads)) {
    if (threads != "0" && threads != "1") {
      return make_error(TRITONSERVER_ERROR_INVALID_ARG, m->where() + "parameter XNNPACK_THREADS is '" + threads +
                        "'; use \"1\" (the instance's own thread) or \"0\" (ExecuTorch's shared pool, sized to the "
                        "cores) in " + m->spec.config_file);
    }
    m->own_thread = threads == "1";
  }
  RETURN_IF_ERROR(read_tensor(*m, j, "input", &m->spec.input, &m->input_type));
  return read_tensor(*m, j, "output", &m->spec.output, &m->output_type);
}

/* ------------------------------------------------------------------ execute */

/* Per request inside one Execute call. */
struct Slot {
  TRITONBACKEND_Response* response = nullptr; /* nullptr once answered (or never created) */
  TRITONBACKEND_Input* input = nullptr;
  uint64_t bytes = 0;
  uint32_t buffers = 0;
  int64_t rows = 0;   /* this request's own batch size: the first dimension of its input */
  int64_t offset = 0; /* its first row in the gathered input */
  bool ok = false;
};

/* Answer one request with an error now; its batch-mates go on (recommended.cc's
 * RESPOND_AND_SET_NULL_IF_ERROR). ResponseSend takes the response, never the error. */
void fail(Slot* s, TRITONSERVER_Error* err) {
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

void fail_all(std::vector<Slot>& slots, const std::string& message) {
  for (Slot& s : slots) {
    if (s.ok) fail(&s, make_error(TRITONSERVER_ERROR_INTERNAL, message));
  }
}

/* Step 0, RESPONSES: one per request before anything else; if one cannot be made none is kept and
 * Execute returns the error, Triton still owning the requests (recommended.cc L497-L517 at r24.10). */
TRITONSERVER_Error* new_responses(TRITONBACKEND_Request** requests, uint32_t count, std::vector<Slot>& slots) {
  for (uint32_t i = 0; i < count; ++i) {
    TRITONSERVER_Error* err = TRITONBACKEND_ResponseNew(&slots[i].response, requests[i]);
    if (err == nullptr) continue;
    for (uint32_t j = 0; j < i; ++j) { /* not sent: still ours to delete */
      TRITONSERVER_Error* del = TRITONBACKEND_ResponseDelete(slots[j].response);
      if (del != nullptr) TRITONSERVER_ErrorDelete(del);
      slots[j].response = nullptr;
    }
    return err;
  }
  return nullptr;
}

/* One request's input: present, of the config's type, [rows >= 1, the config's dims], bytes that match.
 * With the fixed dims this backend accepts, Triton's core has already refused such a request before it
 * was queued (core src/infer_request.cc at r24.10, Normalize() from PrepareForInference() L883: the data
 * type L1097-L1106, the shape L1109-L1157, the byte size L1194-L1226): these checks guard the copy below;
 * they are not how a client hears of its mistake. */
TRITONSERVER_Error* check_input(const EtModel& m, size_t row_bytes, TRITONBACKEND_Request* request, Slot* s) {
  TRITONSERVER_DataType dtype = TRITONSERVER_TYPE_INVALID;
  const int64_t* shape = nullptr;
  uint32_t dims = 0;
  RETURN_IF_ERROR(TRITONBACKEND_RequestInput(request, m.spec.input.name.c_str(), &s->input));
  RETURN_IF_ERROR(TRITONBACKEND_InputProperties(s->input, nullptr, &dtype, &shape, &dims, &s->bytes, &s->buffers));
  const std::string input = std::string(BACKEND) + ": input '" + m.spec.input.name + "'";
  if (dtype != m.input_type) {
    return make_error(TRITONSERVER_ERROR_INVALID_ARG, input + " must be " + TRITONSERVER_DataTypeString(m.input_type) +
                      ", got " + TRITONSERVER_DataTypeString(dtype));
  }
  bool fits = dims == m.spec.input.dims.size() + 1 && shape[0] >= 1;
  for (size_t d = 0; fits && d < m.spec.input.dims.size(); ++d) fits = shape[d + 1] == m.spec.input.dims[d];
  if (!fits || s->bytes != static_cast<uint64_t>(shape[0]) * row_bytes) {
    return make_error(TRITONSERVER_ERROR_INVALID_ARG, input + " must be [rows >= 1, the config's dims] with " +
                      std::to_string(row_bytes) + " bytes a row, got " + std::to_string(s->bytes) + " bytes");
  }
  s->rows = shape[0];
  return nullptr;
}

/* Step 1, CHECK, and step 2, GATHER: each good request's rows copied into the instance's input at
 * the next free row (its own batch size counts); a bad one is answered with its own error. */
int64_t check_and_gather(const EtModel& m, lab_et::Binding* b, TRITONBACKEND_Request** requests,
                         std::vector<Slot>& slots) {
  int64_t total = 0;
  for (size_t i = 0; i < slots.size(); ++i) {
    Slot& s = slots[i];
    TRITONSERVER_Error* err = check_input(m, b->in_row_bytes, requests[i], &s);
    if (err == nullptr && total + s.rows > b->max_rows) { /* Triton's batcher keeps to max_batch_size */
      err = make_error(TRITONSERVER_ERROR_INVALID_ARG, m.where() + "the batch passes the program's bound of " +
                       std::to_string(b->max_rows) + " rows");
    }
    uint64_t copied = 0;
    for (uint32_t k = 0; err == nullptr && k < s.buffers; ++k) {
      const void* buffer = nullptr;
      uint64_t size = 0;
      TRITONSERVER_MemoryType mem = TRITONSERVER_MEMORY_CPU;
      int64_t mem_id = 0;
      err = TRITONBACKEND_InputBuffer(s.input, k, &buffer, &size, &mem, &mem_id);
      if (err == nullptr && (mem == TRITONSERVER_MEMORY_GPU || copied + size > s.bytes)) {
        err = make_error(TRITONSERVER_ERROR_INVALID_ARG, std::string(BACKEND) + ": input buffer in GPU memory or "
                         "past the declared size");
      }
      if (err == nullptr) {
        std::memcpy(b->input.data() + static_cast<size_t>(total) * b->in_row_bytes + copied, buffer, size);
        copied += size;
      }
    }
    if (err != nullptr) {
      fail(&s, err);
      continue;
    }
    s.offset = total;
    s.ok = true;
    total += s.rows;
  }
  return total;
}

/* Step 4, SCATTER: each request's rows of the output in its own response, shaped [rows, dims...]. */
void scatter(const EtModel& m, size_t out_row_bytes, const uint8_t* data, std::vector<Slot>& slots) {
  std::vector<int64_t> shape{0};
  shape.insert(shape.end(), m.spec.output.dims.begin(), m.spec.output.dims.end());
  for (Slot& s : slots) {
    if (!s.ok) continue;
    shape[0] = s.rows;
    TRITONBACKEND_Output* output = nullptr;
    void* buffer = nullptr;
    TRITONSERVER_MemoryType mem = TRITONSERVER_MEMORY_CPU;
    int64_t mem_id = 0;
    const uint64_t bytes = static_cast<uint64_t>(s.rows) * out_row_bytes;
    TRITONSERVER_Error* err = TRITONBACKEND_ResponseOutput(s.response, &output, m.spec.output.name.c_str(),
                                                           m.output_type, shape.data(),
                                                           static_cast<uint32_t>(shape.size()));
    if (err == nullptr) err = TRITONBACKEND_OutputBuffer(output, &buffer, bytes, &mem, &mem_id);
    if (err == nullptr && mem == TRITONSERVER_MEMORY_GPU) {
      err = make_error(TRITONSERVER_ERROR_UNSUPPORTED, std::string(BACKEND) + ": output buffer in GPU memory");
    }
    if (err != nullptr) {
      fail(&s, err);
      continue;
    }
    std::memcpy(buffer, data + static_cast<uint64_t>(s.offset) * out_row_bytes, bytes);
    err = TRITONBACKEND_ResponseSend(s.response, TRITONSERVER_RESPONSE_COMPLETE_FINAL, nullptr);
    s.response = nullptr; /* Triton's now, even if the send failed (lab_triton.h, ResponseSend) */
    if (err != nullptr) {
      LAB_LOG(TRITONSERVER_LOG_ERROR, std::string(BACKEND) + ": send failed: " + TRITONSERVER_ErrorMessage(err));
      TRITONSERVER_ErrorDelete(err);
      s.ok = false;
    }
  }
}

/* Step 5, REPORT and RELEASE: per-request statistics before each release, then one batch record
 * with the rows answered (core src/infer_stats.cc L104-L111, L386-L425 at r24.10). compute_input =
 * check + gather, compute_infer = execute, compute_output = scatter. */
void report(TRITONBACKEND_ModelInstance* instance, TRITONBACKEND_Request** requests, const std::vector<Slot>& slots,
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

/* Per instance: its own program, method and memory (ExecuTorch's Method is not thread-safe). */
struct EtInstance {
  EtModel* model = nullptr;
  lab_et::Binding binding;
};

}  // namespace

/* ------------------------------------------------------------------ entry points (C linkage) */
extern "C" {

/* Once, when the first model using this backend loads: the API version, and ExecuTorch's platform
 * layer (runtime_init: its PAL, before any other runtime call; runtime/platform/runtime.h). */
TRITONSERVER_Error* TRITONBACKEND_Initialize(TRITONBACKEND_Backend* backend) {
  (void)backend;
  uint32_t major = 0, minor = 0;
  RETURN_IF_ERROR(TRITONBACKEND_ApiVersion(&major, &minor));
  if (major != LAB_TRITONBACKEND_API_MAJOR || minor < LAB_TRITONBACKEND_API_MINOR) {
    return make_error(TRITONSERVER_ERROR_UNSUPPORTED, std::string(BACKEND) + ": the server's backend API is " +
                      std::to_string(major) + "." + std::to_string(minor) + "; this backend needs 1.x with x >= 19");
  }
  executorch::runtime::runtime_init();
  LAB_LOG(TRITONSERVER_LOG_INFO, std::string(BACKEND) + ": ExecuTorch runtime initialized, Triton backend API " +
                                 std::to_string(major) + "." + std::to_string(minor));
  return nullptr;
}

/* Once per model (version) load: read and check the config. The state is set last: on an error
 * before it `m` frees what was made and ModelFinalize finds NULL (core src/backend_model.cc L169-175,
 * L983-987 at r24.10: the finalize runs after a failed initialize too). */
TRITONSERVER_Error* TRITONBACKEND_ModelInitialize(TRITONBACKEND_Model* model) {
  auto m = std::make_unique<EtModel>();
  RETURN_IF_ERROR(read_config(model, m.get()));
  RETURN_IF_ERROR(TRITONBACKEND_ModelSetState(model, m.get()));
  m.release(); /* Triton holds it now, until ModelFinalize */
  return nullptr;
}

TRITONSERVER_Error* TRITONBACKEND_ModelFinalize(TRITONBACKEND_Model* model) {
  void* state = nullptr;
  RETURN_IF_ERROR(TRITONBACKEND_ModelState(model, &state));
  delete static_cast<EtModel*>(state);
  return nullptr;
}

/* Once per instance: bind the program to the runtime (lab_executorch_binding.cc). A failure fails the
 * load with the binding's one line; the finalize then finds NULL (core src/backend_model_instance.cc
 * L305-311 at r24.10). XNNPACK creates its runtime, with or without a pool, inside bind(). */
TRITONSERVER_Error* TRITONBACKEND_ModelInstanceInitialize(TRITONBACKEND_ModelInstance* instance) {
  TRITONBACKEND_Model* model = nullptr;
  const char* name = nullptr;
  void* model_state = nullptr;
  RETURN_IF_ERROR(TRITONBACKEND_ModelInstanceName(instance, &name));
  RETURN_IF_ERROR(TRITONBACKEND_ModelInstanceModel(instance, &model));
  RETURN_IF_ERROR(TRITONBACKEND_ModelState(model, &model_state));
  auto in = std::make_unique<EtInstance>();
  in->model = static_cast<EtModel*>(model_state);
  in->binding.spec = in->model->spec;
  const uint64_t started = now_ns();
  std::string why;
  if (in->model->own_thread) {
    executorch::extension::threadpool::NoThreadPoolGuard no_pool; /* thread-local: this load only */
    why = lab_et::bind(&in->binding);
  } else {
    why = lab_et::bind(&in->binding);
  }
  if (!why.empty()) return make_error(TRITONSERVER_ERROR_INVALID_ARG, why);
  RETURN_IF_ERROR(TRITONBACKEND_ModelInstanceSetState(instance, in.get()));
  size_t planned = 0;
  for (const auto& buffer : in->binding.planned) planned += buffer.size();
  LAB_LOG(TRITONSERVER_LOG_INFO, std::string(BACKEND) + ": instance '" + name + "': " + in->binding.spec.program_file +
                                 " bound in " + std::to_string((now_ns() - started) / 1000000) + " ms, " +
                                 std::to_string(in->binding.planned.size()) + " planned buffer(s) of " +
                                 std::to_string(planned) + " bytes, batch bound " +
                                 std::to_string(in->binding.max_rows) + ", XNNPACK " +
                                 (in->model->own_thread ? "on the instance's thread" : "on the shared pool"));
  in.release();
  return nullptr;
}

TRITONSERVER_Error* TRITONBACKEND_ModelInstanceFinalize(TRITONBACKEND_ModelInstance* instance) {
  void* state = nullptr;
  RETURN_IF_ERROR(TRITONBACKEND_ModelInstanceState(instance, &state));
  delete static_cast<EtInstance*>(state); /* the method first, then its memory (Binding's member order) */
  return nullptr;
}

/* One batch, formed by the dynamic batcher. Once responses exist every request gets a response and
 * a release here, and this returns nullptr (recommended.cc at r24.10). */
TRITONSERVER_Error* TRITONBACKEND_ModelInstanceExecute(TRITONBACKEND_ModelInstance* instance,
                                                       TRITONBACKEND_Request** requests, uint32_t count) {
  uint64_t stamps[4] = {now_ns(), 0, 0, 0}; /* exec start, compute start, compute end, exec end */
  void* state = nullptr;
  RETURN_IF_ERROR(TRITONBACKEND_ModelInstanceState(instance, &state));
  EtInstance* in = static_cast<EtInstance*>(state);
  const EtModel& m = *in->model;
  std::vector<Slot> slots(count);
  RETURN_IF_ERROR(new_responses(requests, count, slots)); /* nothing sent yet: Triton answers them */

  const int64_t rows = check_and_gather(m, &in->binding, requests, slots);
  stamps[1] = now_ns();
  const uint8_t* output = nullptr;
  std::string why;
  if (rows > 0) {
    std::unique_ptr<executorch::extension::threadpool::NoThreadPoolGuard> no_pool;
    if (m.own_thread) no_pool = std::make_unique<executorch::extension::threadpool::NoThreadPoolGuard>();
    why = lab_et::run(&in->binding, rows, &output);
  }
  stamps[2] = now_ns();
  if (rows > 0 && why.empty()) scatter(m, in->binding.out_row_bytes, output, slots);
  else if (rows > 0) fail_all(slots, why);
  for (Slot& s : slots) { /* nothing may stay unanswered */
    if (s.response != nullptr) fail(&s, make_error(TRITONSERVER_ERROR_INTERNAL, m.where() + "the batch could not run"));
  }
  stamps[3] = now_ns();
  report(instance, requests, slots, stamps);
  return nullptr;
}

}  // extern "C"
