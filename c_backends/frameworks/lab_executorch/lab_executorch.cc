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
 * what every framework backend shares, and speaks only to Triton and to the binding (the steps the
 * C++ framework backends take the same way are lab_framework_steps.h's, in c_backends/frameworks/include/).
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
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <executorch/extension/threadpool/threadpool_guard.h>
#include <executorch/runtime/platform/runtime.h>

#include "lab_executorch_binding.h"
#include "lab_framework_steps.h" /* the steps every C++ framework backend shares; config_json.h */

namespace {

using lab_fw::fail;
using lab_fw::now_ns;
using lab_fw::Slot;

constexpr const char* BACKEND = "lab_executorch";
constexpr const char* DEFAULT_FILENAME = "model.pte";

/* ------------------------------------------------------------------ small helpers */

/* The message as it is, not lab_fw::make_error's one line: the binding's own line reaches the load
 * error unchanged (notebook 09d's checker reads a learner's first line). */
TRITONSERVER_Error* make_error(TRITONSERVER_Error_Code code, const std::string& message) {
  return TRITONSERVER_ErrorNew(code, message.c_str());
}

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
  lab_fw::ModelConfig c;
  RETURN_IF_ERROR(lab_fw::read_model_config(model, &c));
  m->spec.model = c.name;
  m->spec.config_file = c.config_file;
  RETURN_IF_ERROR(lab_fw::read_max_batch_size(c, m->where(), &m->spec.max_batch_size));
  m->spec.program_file = lab_fw::model_file(c, DEFAULT_FILENAME);

  const char* j = c.json.c_str();
  std::string threads;
  if (lab_fw::parameter(j, "XNNPACK_THREADS", &threads)) {
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

/* Per request inside one Execute call: lab_fw::Slot (its offset is its first row in the gathered
 * input); lab_fw::fail answers one with an error, its batch-mates going on. */

void fail_all(std::vector<Slot>& slots, const std::string& message) {
  for (Slot& s : slots) {
    if (s.ok) fail(&s, make_error(TRITONSERVER_ERROR_INTERNAL, message));
  }
}

/* Step 0, RESPONSES: lab_fw::new_responses, one per request before anything else, or none. */

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
  const char* rows = reinterpret_cast<const char*>(data);
  for (Slot& s : slots) {
    if (!s.ok) continue;
    shape[0] = s.rows;
    lab_fw::send_rows(&s, BACKEND, m.spec.output.name, m.output_type, shape,
                      rows + static_cast<uint64_t>(s.offset) * out_row_bytes, static_cast<uint64_t>(s.rows) * out_row_bytes);
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
  RETURN_IF_ERROR(lab_fw::check_api_version(BACKEND, major, minor));
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
  return lab_fw::delete_model_state<EtModel>(model);
}

/* Once per instance: bind the program to the runtime (lab_executorch_binding.cc). A failure fails the
 * load with the binding's one line; the finalize then finds NULL (core src/backend_model_instance.cc
 * L305-311 at r24.10). XNNPACK creates its runtime, with or without a pool, inside bind(). */
TRITONSERVER_Error* TRITONBACKEND_ModelInstanceInitialize(TRITONBACKEND_ModelInstance* instance) {
  const char* name = nullptr;
  RETURN_IF_ERROR(TRITONBACKEND_ModelInstanceName(instance, &name));
  auto in = std::make_unique<EtInstance>();
  RETURN_IF_ERROR(lab_fw::model_state_of(instance, &in->model));
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

/* The method goes first, then its memory (Binding's member order). */
TRITONSERVER_Error* TRITONBACKEND_ModelInstanceFinalize(TRITONBACKEND_ModelInstance* instance) {
  return lab_fw::delete_instance_state<EtInstance>(instance);
}

/* One batch, formed by the dynamic batcher. Once responses exist every request gets a response and
 * a release here, and this returns nullptr (recommended.cc at r24.10). */
TRITONSERVER_Error* TRITONBACKEND_ModelInstanceExecute(TRITONBACKEND_ModelInstance* instance,
                                                       TRITONBACKEND_Request** requests, uint32_t count) {
  uint64_t stamps[4] = {now_ns(), 0, 0, 0}; /* exec start, compute start, compute end, exec end */
  EtInstance* in = nullptr;
  RETURN_IF_ERROR(lab_fw::instance_state_of(instance, &in));
  const EtModel& m = *in->model;
  std::vector<Slot> slots(count);
  RETURN_IF_ERROR(lab_fw::new_responses(requests, count, slots)); /* nothing sent yet: Triton answers them */

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
  lab_fw::fail_unanswered(slots, m.where() + "the batch could not run");
  stamps[3] = now_ns();
  /* Step 5, REPORT and RELEASE (lab_fw::report): compute_input = check + gather, compute_infer =
   * execute, compute_output = scatter. */
  lab_fw::report(instance, requests, slots, stamps);
  return nullptr;
}

}  // extern "C"
