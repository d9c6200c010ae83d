/*
 * lab_libtorch.cc - backend "lab_libtorch": a TorchScript model served in-process, in C++, through
 * libtorch (the torch wheel's torch/lib/libtorch_cpu.so and its headers).
 *
 * The same loop as lab_tensorflow.c, and as Triton's own pytorch_backend (src/libtorch.cc at r24.10:
 * torch::jit::load ~L298, at::set_num_threads ~L512, ProcessRequests ~L1265-1420, the input
 * collector ~L1388-1405, Execute ~L1570, the output responder ~L2232):
 *   load:     the TorchScript file once per instance (torch::jit::load), under torch::InferenceMode,
 *             intra-op threads from the config; then one probe row through the model, which checks
 *             the config's types and dims against what the model really computes;
 *   execute:  GATHER every request of the batch into one at::Tensor (each at its row offset), RUN
 *             module.forward once, SCATTER each request's rows into its own response, report
 *             statistics, release. (Only a config with a -1 dim can bring rows of several shapes
 *             into one batch: then one tensor and one forward per shape, see Group.)
 * The module is a C++ file against lab_triton.h (C linkage below); the helpers of
 * lab_backend_util.h are C (void* conversions), so the few this backend needs are written in C++,
 * with RAII, in lab_framework_steps.h (c_backends/frameworks/include/, shared with lab_executorch
 * and lab_kvcache: responses, the send, statistics and release) and here (libtorch's own). Every exception libtorch throws is caught at the boundary of the step that
 * called it: none may cross into Triton (an escaped exception ends the server process; the test
 * switch LAB_TEST_UNGUARDED_FORWARD shows it).
 *
 * Config (pytorch_backend's names where it has one): exactly one input and one output (names are
 * the config's; TorchScript takes positional tensors), default_model_filename (default
 * "model.pt"), INTRA_OP_THREAD_COUNT (at::set_num_threads; absent or 0: libtorch's own choice,
 * OMP_NUM_THREADS). libtorch's intra-op setting belongs to the process like TensorFlow's pools: the
 * last model to set it wins for threads that have not run torch yet, so Execute re-applies this
 * model's count on its own thread (cheap: an OpenMP query) before each forward.
 *
 * Build: lab_backends.server.native_backends.build_libtorch() (g++ -std=c++20 -Wall -Wextra -Werror,
 * torch's headers as system headers, -D_GLIBCXX_USE_CXX11_ABI as torch was built, -Wl,-z,defs
 * against libtritonserver and the wheel's libtorch_cpu/libc10, rpath to torch/lib).
 */
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include <ATen/Parallel.h>
#include <torch/headeronly/version.h>
#include <torch/script.h>

#include "lab_framework_steps.h" /* the steps every C++ framework backend shares; config_json.h */

namespace {

using lab_fw::make_error;
using lab_fw::now_ns;
using lab_fw::one_line;

constexpr const char* BACKEND = "lab_libtorch";
constexpr const char* DEFAULT_FILENAME = "model.pt";
constexpr int MAX_DIMS = 8;
constexpr long MAX_THREADS = 1024;

/* ------------------------------------------------------------------ small helpers */

/* What libtorch says, in one line: without the C++ backtrace c10::Error appends, and of a
 * TorchScript traceback ("The following operation failed in the TorchScript interpreter. Traceback
 * ...") only its last line, which names the failing op ("RuntimeError: mat1 and mat2 shapes cannot
 * be multiplied (1x63 and 64x2048)"). Capped: the fix after it must survive. */
std::string torch_message(const std::exception& ex) {
  const auto* c10 = dynamic_cast<const c10::Error*>(&ex);
  std::string text = c10 != nullptr ? c10->what_without_backtrace() : ex.what();
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  const size_t last = text.rfind('\n');
  if (last != std::string::npos && text.rfind("The following operation failed", 0) == 0) text = text.substr(last + 1);
  return one_line(text, 400);
}

/* ------------------------------------------------------------------ types: Triton <-> libtorch */

struct Type {
  const char* config_name;
  TRITONSERVER_DataType triton;
  at::ScalarType torch;
};
constexpr Type TYPES[] = {
    {"TYPE_FP32", TRITONSERVER_TYPE_FP32, at::kFloat},   {"TYPE_FP64", TRITONSERVER_TYPE_FP64, at::kDouble},
    {"TYPE_FP16", TRITONSERVER_TYPE_FP16, at::kHalf},    {"TYPE_BF16", TRITONSERVER_TYPE_BF16, at::kBFloat16},
    {"TYPE_INT8", TRITONSERVER_TYPE_INT8, at::kChar},    {"TYPE_INT16", TRITONSERVER_TYPE_INT16, at::kShort},
    {"TYPE_INT32", TRITONSERVER_TYPE_INT32, at::kInt},   {"TYPE_INT64", TRITONSERVER_TYPE_INT64, at::kLong},
    {"TYPE_UINT8", TRITONSERVER_TYPE_UINT8, at::kByte},  {"TYPE_BOOL", TRITONSERVER_TYPE_BOOL, at::kBool},
};

const Type* type_by_config_name(const char* name) {
  for (const Type& t : TYPES) {
    if (std::strcmp(t.config_name, name) == 0) return &t;
  }
  return nullptr;
}

const Type* type_by_torch(at::ScalarType torch) {
  for (const Type& t : TYPES) {
    if (t.torch == torch) return &t;
  }
  return nullptr;
}

std::string config_name(at::ScalarType torch) {
  const Type* t = type_by_torch(torch);
  return t != nullptr ? t->config_name : std::string("no Triton type (") + c10::toString(torch) + ")";
}

std::string shape_text(const int64_t* shape, size_t dims) {
  std::string text = "[";
  for (size_t d = 0; d < dims; ++d) text += (d ? ", " : "") + std::to_string(shape[d]);
  return text + "]";
}

/* ------------------------------------------------------------------ model: the config */

/* One tensor of the config: name, type, dims without the batch dimension (-1: any size). */
struct ConfigTensor {
  std::string name;
  const Type* type = nullptr;
  std::vector<int64_t> dims;
};

/* Per model: what the config says and where the file is. */
struct TorchModel {
  std::string name;
  std::string config_file; /* <model folder>/config.pbtxt, named in load errors */
  std::string model_file;  /* <model folder>/<version>/<default_model_filename> */
  long intra_threads = 0;  /* 0: libtorch's choice */
  bool unguarded_forward = false;
  ConfigTensor input, output;

  std::string where() const { return std::string(BACKEND) + ": model '" + name + "': "; }
};

/* Exactly one input and one output: the gather and the scatter move one tensor (pytorch_backend
 * loops the same code over every input and output, by position: INPUT__0, OUTPUT__0 ...). */
TRITONSERVER_Error* read_tensor(const TorchModel& m, const char* json, const char* list, ConfigTensor* t) {
  size_t count = 0;
  const char* tensor = json_element(json_member(json, list), 0, &count);
  if (count != 1 || tensor == nullptr) {
    return make_error(TRITONSERVER_ERROR_INVALID_ARG,
                 m.where() + m.config_file + " declares " + std::to_string(count) + " " + list +
                     " tensors; this backend serves exactly one input and one output: keep one in " +
                     list + "[ ... ] in " + m.config_file);
  }
  char name[128] = "", dtype[32] = "";
  if (!json_string(json_member(tensor, "name"), name, sizeof name) ||
      !json_string(json_member(tensor, "data_type"), dtype, sizeof dtype)) {
    return make_error(TRITONSERVER_ERROR_INVALID_ARG,
                 m.where() + "the " + list + " in " + m.config_file + " needs a name and a data_type");
  }
  t->name = name;
  t->type = type_by_config_name(dtype);
  if (t->type == nullptr) {
    return make_error(TRITONSERVER_ERROR_INVALID_ARG,
                 m.where() + list + " '" + name + "' has data_type " + dtype +
                     ", which this backend does not move (numeric types only); fix data_type in " + m.config_file);
  }
  const char* dims = json_member(tensor, "dims");
  size_t n = 0;
  json_element(dims, 0, &n);
  if (n + 1 > MAX_DIMS) {
    return make_error(TRITONSERVER_ERROR_INVALID_ARG, m.where() + list + " '" + name + "' has too many dims; "
                 "fix dims in " + m.config_file);
  }
  for (size_t d = 0; d < n; ++d) {
    size_t ignored = 0;
    int64_t v = 0;
    if (!json_int(json_element(dims, d, &ignored), &v)) {
      return make_error(TRITONSERVER_ERROR_INVALID_ARG,
                   m.where() + "dims of '" + name + "' in " + m.config_file + " are not integers");
    }
    t->dims.push_back(v);
  }
  return nullptr;
}

TRITONSERVER_Error* read_config(TRITONBACKEND_Model* model, TorchModel* m) {
  lab_fw::ModelConfig c;
  RETURN_IF_ERROR(lab_fw::read_model_config(model, &c));
  m->name = c.name;
  m->config_file = c.config_file;
  int64_t max_batch = 0;
  RETURN_IF_ERROR(lab_fw::read_max_batch_size(c, m->where(), &max_batch));
  m->model_file = lab_fw::model_file(c, DEFAULT_FILENAME);

  const char* j = c.json.c_str();
  std::string text;
  if (lab_fw::parameter(j, "INTRA_OP_THREAD_COUNT", &text)) {
    errno = 0;
    char* end = nullptr;
    long v = std::strtol(text.c_str(), &end, 10);
    if (errno != 0 || end == text.c_str() || *end != '\0' || v < 0 || v > MAX_THREADS) {
      return make_error(TRITONSERVER_ERROR_INVALID_ARG,
                   m->where() + "parameter INTRA_OP_THREAD_COUNT must be a whole number 0.." +
                       std::to_string(MAX_THREADS) + " (0: libtorch chooses), got '" + text +
                       "'; fix parameters { key: \"INTRA_OP_THREAD_COUNT\" ... } in " + m->config_file);
    }
    m->intra_threads = v;
  }
  m->unguarded_forward = lab_fw::parameter(j, "LAB_TEST_UNGUARDED_FORWARD", &text) && text == "1";
  RETURN_IF_ERROR(read_tensor(*m, j, "input", &m->input));
  return read_tensor(*m, j, "output", &m->output);
}

/* A missing file fails the load now, naming it and how to make it, instead of a libtorch message
 * about a zip archive later. */
TRITONSERVER_Error* check_model_file(const TorchModel& m) {
  struct stat st;
  if (stat(m.model_file.c_str(), &st) == 0 && S_ISREG(st.st_mode)) return nullptr;
  return make_error(TRITONSERVER_ERROR_INVALID_ARG,
               m.where() + "no TorchScript file at " + m.model_file + "; run `lab-backends build-models` "
               "to export it there (torch.jit.save), or name the file with default_model_filename in " +
                   m.config_file);
}

/* ------------------------------------------------------------------ instance: load libtorch */

/* Per instance: its own module (pytorch_backend loads one per instance too, unless
 * ENABLE_WEIGHT_SHARING), so two instances run forward side by side. */
struct TorchInstance {
  TorchModel* model = nullptr;
  torch::jit::Module module;
};

/* Apply the model's intra-op thread count on the calling thread (see the header). */
void apply_threads(const TorchModel& m) {
  if (m.intra_threads > 0 && at::get_num_threads() != m.intra_threads) {
    at::set_num_threads(static_cast<int>(m.intra_threads));
  }
}

TRITONSERVER_Error* load_module(TorchInstance* in) {
  const TorchModel& m = *in->model;
  try {
    in->module = torch::jit::load(m.model_file, torch::kCPU);
    in->module.eval();
  } catch (const std::exception& ex) {
    return make_error(TRITONSERVER_ERROR_INVALID_ARG,
                 m.where() + "libtorch could not load " + m.model_file + " as TorchScript: " +
                     torch_message(ex) + "; export it with torch.jit.trace/torch.jit.save (lab-backends "
                     "build-models) or fix default_model_filename in " + m.config_file);
  }
  return nullptr;
}

/* The dtype of the module's first parameter (what its weights compute in), if it has one. */
bool parameter_type(const torch::jit::Module& module, at::ScalarType* out) {
  for (at::Tensor p : module.parameters()) {
    *out = p.scalar_type();
    return true;
  }
  return false;
}

/* One row of zeros, of the config's type and dims, through the model: TorchScript files carry no
 * signature, so this is how the config is checked against the model at load (and it warms up the
 * profiling executor). A dim of -1 leaves the row unknown: then nothing is probed. */
TRITONSERVER_Error* probe(TorchInstance* in) {
  const TorchModel& m = *in->model;
  std::vector<int64_t> shape{1};
  for (int64_t d : m.input.dims) {
    if (d < 0) return nullptr;
    shape.push_back(d);
  }
  at::Tensor result;
  try {
    at::Tensor row = torch::zeros(shape, torch::TensorOptions().dtype(m.input.type->torch));
    c10::IValue out = in->module.forward({row});
    if (!out.isTensor()) {
      return make_error(TRITONSERVER_ERROR_INVALID_ARG,
                   m.where() + m.model_file + " returns " + out.tagKind() + ", not one tensor; export a "
                   "model whose forward returns a tensor");
    }
    result = out.toTensor();
  } catch (const std::exception& ex) {
    at::ScalarType weights;
    std::string fix = "fix data_type and dims of '" + m.input.name + "' in " + m.config_file;
    if (parameter_type(in->module, &weights) && weights != m.input.type->torch) {
      fix = "set data_type: " + config_name(weights) + " for '" + m.input.name + "' in " + m.config_file;
    }
    return make_error(TRITONSERVER_ERROR_INVALID_ARG,
                 m.where() + "input '" + m.input.name + "' is " + m.input.type->config_name + " " +
                     shape_text(shape.data() + 1, shape.size() - 1) + " in " + m.config_file + ", but " +
                     m.model_file + " cannot take one such row: " + torch_message(ex) + "; " + fix);
  }
  if (result.scalar_type() != m.output.type->torch) {
    return make_error(TRITONSERVER_ERROR_INVALID_ARG,
                 m.where() + "output '" + m.output.name + "' is " + m.output.type->config_name + " in " +
                     m.config_file + " but " + m.model_file + " returns " + c10::toString(result.scalar_type()) +
                     "; set data_type: " + config_name(result.scalar_type()) + " for '" + m.output.name +
                     "' in " + m.config_file);
  }
  bool fits = result.dim() == static_cast<int64_t>(m.output.dims.size()) + 1 && result.size(0) == 1;
  for (size_t d = 0; fits && d < m.output.dims.size(); ++d) {
    fits = m.output.dims[d] < 0 || result.size(static_cast<int64_t>(d) + 1) == m.output.dims[d];
  }
  if (!fits) {
    std::vector<int64_t> got(result.sizes().begin(), result.sizes().end());
    return make_error(TRITONSERVER_ERROR_INVALID_ARG,
                 m.where() + "output '" + m.output.name + "' has dims " +
                     shape_text(m.output.dims.data(), m.output.dims.size()) + " in " + m.config_file + ", but " +
                     m.model_file + " returns " + shape_text(got.data(), got.size()) + " for one row; set "
                     "dims to match (without the batch dimension) in " + m.config_file);
  }
  return nullptr;
}

/* ------------------------------------------------------------------ execute */

/* Per request inside one Execute call: lab_fw::Slot (response, input, bytes, rows, offset in its group's
 * tensor, ok), with its shape and its group. */
struct Slot : lab_fw::Slot {
  const int64_t* shape = nullptr; /* valid until the request is released */
  uint32_t dims = 0;
  size_t group = 0; /* which tensor of the batch holds its rows (one per row shape) */
};

/* The requests of a batch whose rows have one shape: one tensor, one forward. With the config's
 * dims all fixed there is one group; a -1 dim (allow_ragged_batch) can bring rows of several
 * shapes into one batch, and a TorchScript file names no shape to check them against, so each
 * shape runs on its own: a shape the model cannot take fails only the requests that sent it. */
struct Group {
  std::vector<int64_t> row_shape;
  int64_t total = 0; /* rows */
  at::Tensor batch, result;
};

/* Answer one request with an error now (lab_fw::fail): its batch-mates go on. */
using lab_fw::fail;

/* Fail every pending request of group g with one message (each gets its own copy). */
void fail_group(std::vector<Slot>& slots, size_t g, const std::string& message) {
  for (Slot& s : slots) {
    if (s.ok && s.group == g) fail(&s, make_error(TRITONSERVER_ERROR_INTERNAL, message));
  }
}

/* One request's input: present, of the config's type, [rows >= 1, row dims], bytes that match. */
TRITONSERVER_Error* check_input(const TorchModel& m, TRITONBACKEND_Request* request, Slot* s) {
  TRITONSERVER_DataType dtype = TRITONSERVER_TYPE_INVALID;
  RETURN_IF_ERROR(TRITONBACKEND_RequestInput(request, m.input.name.c_str(), &s->input));
  RETURN_IF_ERROR(TRITONBACKEND_InputProperties(s->input, nullptr, &dtype, &s->shape, &s->dims, &s->bytes, &s->buffers));
  const std::string input = std::string(BACKEND) + ": input '" + m.input.name + "'";
  if (dtype != m.input.type->triton) {
    return make_error(TRITONSERVER_ERROR_INVALID_ARG, input + " must be " +
                      TRITONSERVER_DataTypeString(m.input.type->triton) + ", got " + TRITONSERVER_DataTypeString(dtype));
  }
  if (s->dims != m.input.dims.size() + 1 || s->shape[0] < 1) {
    return make_error(TRITONSERVER_ERROR_INVALID_ARG, input + " must be [rows, ...] with rows >= 1 and row dims " +
                      shape_text(m.input.dims.data(), m.input.dims.size()));
  }
  /* A shape such as [1, 2^62+1] wraps to a small product that matches a tiny body: check every step. */
  uint64_t elements = static_cast<uint64_t>(s->shape[0]);
  for (size_t d = 0; d < m.input.dims.size(); ++d) {
    const int64_t got = s->shape[d + 1];
    if (got < 0 || (m.input.dims[d] >= 0 && got != m.input.dims[d])) {
      return make_error(TRITONSERVER_ERROR_INVALID_ARG, input + " has shape " + shape_text(s->shape, s->dims) +
                        ", but the model takes rows of " + shape_text(m.input.dims.data(), m.input.dims.size()));
    }
    if (__builtin_mul_overflow(elements, static_cast<uint64_t>(got), &elements)) {
      return make_error(TRITONSERVER_ERROR_INVALID_ARG, input + " has a shape whose element count overflows 64 bits");
    }
  }
  uint64_t needed = 0;
  const uint64_t element = static_cast<uint64_t>(c10::elementSize(m.input.type->torch));
  if (__builtin_mul_overflow(elements, element, &needed) || needed != s->bytes) {
    return make_error(TRITONSERVER_ERROR_INVALID_ARG, input + " holds " + std::to_string(s->bytes) +
                      " bytes, which its shape " + shape_text(s->shape, s->dims) + " does not describe");
  }
  return nullptr;
}

/* Step 0, RESPONSES: lab_fw::new_responses, one per request before anything else, or none. */

/* Step 1, CHECK: a checked input for each request, whose response exists (step 0); a bad one is
 * answered with its own error here. Triton already refused what contradicts the config (400 before the
 * batcher); this is the backend's own guard. Then each good request joins the group of its row
 * shape, at the group's next free row: its own batch size counts. */
std::vector<Group> check_requests(const TorchModel& m, TRITONBACKEND_Request** requests, uint32_t count,
                                  std::vector<Slot>& slots) {
  std::vector<Group> groups;
  for (uint32_t i = 0; i < count; ++i) {
    Slot& s = slots[i];
    TRITONSERVER_Error* err = check_input(m, requests[i], &s);
    if (err != nullptr) {
      fail(&s, err);
      continue;
    }
    std::vector<int64_t> row(s.shape + 1, s.shape + s.dims);
    size_t g = 0;
    while (g < groups.size() && groups[g].row_shape != row) ++g;
    if (g == groups.size()) groups.push_back(Group{row, 0, {}, {}});
    s.rows = s.shape[0];
    s.group = g;
    s.offset = groups[g].total;
    s.ok = true;
    groups[g].total += s.rows;
  }
  return groups;
}

/* Copy one request's input, which may come in several buffers, to 'dst'. */
TRITONSERVER_Error* copy_input(const Slot& s, char* dst) {
  uint64_t copied = 0;
  for (uint32_t b = 0; b < s.buffers; ++b) {
    const void* buffer = nullptr;
    uint64_t size = 0;
    TRITONSERVER_MemoryType mem = TRITONSERVER_MEMORY_CPU;
    int64_t mem_id = 0;
    RETURN_IF_ERROR(TRITONBACKEND_InputBuffer(s.input, b, &buffer, &size, &mem, &mem_id));
    if (mem == TRITONSERVER_MEMORY_GPU) {
      return make_error(TRITONSERVER_ERROR_UNSUPPORTED, std::string(BACKEND) + ": input in GPU memory; CPU only here");
    }
    if (copied + size > s.bytes) {
      return make_error(TRITONSERVER_ERROR_INTERNAL, std::string(BACKEND) + ": input buffers exceed the declared size");
    }
    std::memcpy(dst + copied, buffer, size);
    copied += size;
  }
  if (copied != s.bytes) {
    return make_error(TRITONSERVER_ERROR_INTERNAL, std::string(BACKEND) + ": input buffers hold fewer bytes than declared");
  }
  return nullptr;
}

/* Step 2, GATHER: one at::Tensor [group rows, row shape...] holding each of the group's requests at
 * its offset (pytorch_backend's BackendInputCollector, src/libtorch.cc ~L1388-1405). */
void gather(const TorchModel& m, std::vector<Slot>& slots, size_t g, Group* group) {
  std::vector<int64_t> shape{group->total};
  shape.insert(shape.end(), group->row_shape.begin(), group->row_shape.end());
  try {
    group->batch = torch::empty(shape, torch::TensorOptions().dtype(m.input.type->torch));
  } catch (const std::exception& ex) {
    fail_group(slots, g, m.where() + "no memory for a batch of " + std::to_string(group->total) + " rows: " +
                             torch_message(ex));
    return;
  }
  const int64_t row_bytes = static_cast<int64_t>(group->batch.nbytes()) / group->total;
  char* data = static_cast<char*>(group->batch.data_ptr());
  for (Slot& s : slots) {
    if (!s.ok || s.group != g) continue;
    TRITONSERVER_Error* err = copy_input(s, data + s.offset * row_bytes);
    if (err != nullptr) fail(&s, err);
  }
}

/* Step 3, RUN: forward once for the group. A libtorch exception fails the group's requests with its
 * words; none escapes to Triton - unless the test switch asks for exactly that. */
void run(TorchInstance* in, std::vector<Slot>& slots, size_t g, Group* group) {
  const TorchModel& m = *in->model;
  std::vector<c10::IValue> inputs{group->batch};
  if (m.unguarded_forward) { /* a backend without the try/catch: std::terminate, the server aborts */
    group->result = [&]() noexcept { return in->module.forward(inputs).toTensor(); }();
    return;
  }
  std::string why;
  try {
    c10::IValue out = in->module.forward(inputs);
    if (out.isTensor()) {
      group->result = out.toTensor().contiguous(); /* the scatter reads rows as bytes */
      return;
    }
    why = std::string("forward returned ") + out.tagKind() + ", not one tensor";
  } catch (const std::exception& ex) {
    why = torch_message(ex);
  }
  fail_group(slots, g, m.where() + "PyTorch failed the batch: " + why);
}

/* Is the result what the config promises: its type, the group's rows, the config's dims after them? */
bool result_fits(const TorchModel& m, const at::Tensor& result, int64_t total, std::string* why) {
  bool fits = result.scalar_type() == m.output.type->torch &&
              result.dim() == static_cast<int64_t>(m.output.dims.size()) + 1 && result.size(0) == total;
  for (size_t d = 0; fits && d < m.output.dims.size(); ++d) {
    fits = m.output.dims[d] < 0 || result.size(static_cast<int64_t>(d) + 1) == m.output.dims[d];
  }
  if (!fits) {
    std::vector<int64_t> got(result.sizes().begin(), result.sizes().end());
    *why = m.where() + "PyTorch returned " + c10::toString(result.scalar_type()) + " " +
           shape_text(got.data(), got.size()) + " for " + std::to_string(total) + " rows; the config promises " +
           m.output.type->config_name + " [rows + " + std::to_string(m.output.dims.size()) + " dims]";
  }
  return fits;
}

/* Step 4, SCATTER: each of the group's requests gets its rows of the result in its own response,
 * shaped [rows, dims...], and is sent (pytorch_backend's BackendOutputResponder, src/libtorch.cc
 * ~L2232). */
void scatter(const TorchModel& m, std::vector<Slot>& slots, size_t g, const Group& group) {
  std::vector<int64_t> shape(group.result.sizes().begin(), group.result.sizes().end());
  const uint64_t row_bytes = static_cast<uint64_t>(group.result.nbytes()) / static_cast<uint64_t>(group.total);
  const char* data = static_cast<const char*>(group.result.data_ptr());
  for (Slot& s : slots) {
    if (!s.ok || s.group != g) continue;
    shape[0] = s.rows;
    lab_fw::send_rows(&s, BACKEND, m.output.name, m.output.type->triton, shape,
                      data + static_cast<uint64_t>(s.offset) * row_bytes, static_cast<uint64_t>(s.rows) * row_bytes);
  }
}

}  // namespace

/* ------------------------------------------------------------------ entry points (C linkage) */
extern "C" {

/* Once, when the first model using this backend loads: check the API version. */
TRITONSERVER_Error* TRITONBACKEND_Initialize(TRITONBACKEND_Backend* backend) {
  (void)backend;
  uint32_t major = 0, minor = 0;
  RETURN_IF_ERROR(TRITONBACKEND_ApiVersion(&major, &minor));
  LAB_LOG(TRITONSERVER_LOG_INFO, std::string(BACKEND) + ": libtorch " + std::to_string(TORCH_VERSION_MAJOR) + "." +
                                 std::to_string(TORCH_VERSION_MINOR) + "." + std::to_string(TORCH_VERSION_PATCH) + ", Triton backend API " +
                                 std::to_string(major) + "." + std::to_string(minor));
  return lab_fw::check_api_version(BACKEND, major, minor);
}

/* Once per model (version) load: read and check the config and the file. An error fails the load,
 * and Triton then calls ModelFinalize all the same: the error unwinds the unique_ptr holding the
 * model (core src/backend_model.cc L169-175 at r24.10), whose destructor calls the fini function
 * unconditionally (L983-987). So the state is set last: on an error before it, `m` frees what was
 * made and ModelFinalize finds NULL (deleting it here after setting it would be a double free). */
TRITONSERVER_Error* TRITONBACKEND_ModelInitialize(TRITONBACKEND_Model* model) {
  auto m = std::make_unique<TorchModel>();
  RETURN_IF_ERROR(read_config(model, m.get()));
  RETURN_IF_ERROR(check_model_file(*m));
  RETURN_IF_ERROR(TRITONBACKEND_ModelSetState(model, m.get()));
  LAB_LOG(TRITONSERVER_LOG_INFO, m->where() + "TorchScript " + m->model_file + ", intra-op threads " +
                                 (m->intra_threads > 0 ? std::to_string(m->intra_threads) : std::string("default")));
  m.release(); /* Triton holds it now, until ModelFinalize */
  return nullptr;
}

/* At unload, after every instance; and after a failed load, with the state NULL when
 * ModelInitialize failed. */
TRITONSERVER_Error* TRITONBACKEND_ModelFinalize(TRITONBACKEND_Model* model) {
  void* state = nullptr;
  RETURN_IF_ERROR(TRITONBACKEND_ModelState(model, &state));
  if (state == nullptr) {
    const char* name = "?";
    RETURN_IF_ERROR(TRITONBACKEND_ModelName(model, &name));
    LAB_LOG(TRITONSERVER_LOG_INFO, std::string(BACKEND) + ": model '" + name +
                                   "': ModelFinalize with no state: its ModelInitialize failed");
  }
  delete static_cast<TorchModel*>(state);
  return nullptr;
}

/* Once per instance: load the module and probe it, under InferenceMode (pytorch_backend guards the
 * load the same way, src/libtorch.cc ~L289-291). A failure here also gets its ModelInstanceFinalize
 * (core src/backend_model_instance.cc L305-311, the destructor L209-214 at r24.10): the state is set
 * last, so `in` frees what was made and the finalize finds NULL. */
TRITONSERVER_Error* TRITONBACKEND_ModelInstanceInitialize(TRITONBACKEND_ModelInstance* instance) {
  TRITONBACKEND_Model* model = nullptr;
  const char* name = nullptr;
  void* model_state = nullptr;
  RETURN_IF_ERROR(TRITONBACKEND_ModelInstanceName(instance, &name));
  RETURN_IF_ERROR(TRITONBACKEND_ModelInstanceModel(instance, &model));
  RETURN_IF_ERROR(TRITONBACKEND_ModelState(model, &model_state));
  auto in = std::make_unique<TorchInstance>();
  in->model = static_cast<TorchModel*>(model_state);
  const uint64_t started = now_ns();
  c10::InferenceMode guard;
  apply_threads(*in->model); /* pytorch_backend: at::set_num_threads at load, src/libtorch.cc ~L512 */
  RETURN_IF_ERROR(load_module(in.get()));
  RETURN_IF_ERROR(probe(in.get()));
  RETURN_IF_ERROR(TRITONBACKEND_ModelInstanceSetState(instance, in.get()));
  LAB_LOG(TRITONSERVER_LOG_INFO, std::string(BACKEND) + ": instance '" + name + "': module loaded and probed in " +
                                 std::to_string((now_ns() - started) / 1000000) + " ms, " +
                                 std::to_string(at::get_num_threads()) + " intra-op thread(s)");
  in.release();
  return nullptr;
}

TRITONSERVER_Error* TRITONBACKEND_ModelInstanceFinalize(TRITONBACKEND_ModelInstance* instance) {
  void* state = nullptr;
  RETURN_IF_ERROR(TRITONBACKEND_ModelInstanceState(instance, &state));
  if (state == nullptr) {
    const char* name = "?";
    RETURN_IF_ERROR(TRITONBACKEND_ModelInstanceName(instance, &name));
    LAB_LOG(TRITONSERVER_LOG_INFO, std::string(BACKEND) + ": instance '" + name +
                                   "': ModelInstanceFinalize with no state: its ModelInstanceInitialize failed");
  }
  delete static_cast<TorchInstance*>(state); /* the module's weights go with it */
  return nullptr;
}

/* One batch, formed by the dynamic batcher. Once responses exist every request gets a response and
 * a release here, and this returns nullptr (recommended.cc at r24.10). */
TRITONSERVER_Error* TRITONBACKEND_ModelInstanceExecute(TRITONBACKEND_ModelInstance* instance,
                                                       TRITONBACKEND_Request** requests, uint32_t count) {
  uint64_t stamps[4] = {now_ns(), 0, 0, 0}; /* exec start, compute start, compute end, exec end */
  TorchInstance* in = nullptr;
  RETURN_IF_ERROR(lab_fw::instance_state_of(instance, &in));
  const TorchModel& m = *in->model;
  std::vector<Slot> slots(count);
  RETURN_IF_ERROR(lab_fw::new_responses(requests, count, slots)); /* nothing sent yet: Triton answers them */
  c10::InferenceMode guard; /* no autograd records: pytorch_backend's Execute, src/libtorch.cc ~L1586 */
  apply_threads(m);

  std::vector<Group> groups = check_requests(m, requests, count, slots);
  for (size_t g = 0; g < groups.size(); ++g) gather(m, slots, g, &groups[g]);
  stamps[1] = now_ns();
  for (size_t g = 0; g < groups.size(); ++g) {
    if (groups[g].batch.defined()) run(in, slots, g, &groups[g]);
  }
  stamps[2] = now_ns();
  for (size_t g = 0; g < groups.size(); ++g) {
    std::string why;
    if (!groups[g].result.defined()) continue;
    if (result_fits(m, groups[g].result, groups[g].total, &why)) scatter(m, slots, g, groups[g]);
    else fail_group(slots, g, why);
  }
  lab_fw::fail_unanswered(slots, m.where() + "the batch could not run");
  stamps[3] = now_ns();
  /* Step 5, REPORT and RELEASE (lab_fw::report: statistics, release, one batch record of the rows
   * answered). compute_input = check + gather, compute_infer = forward, compute_output = scatter.
   * pytorch_backend records the batch it was handed instead: every request's rows (src/libtorch.cc
   * L1295-1356 at r24.10), unless every response failed (L1559-1566). The two differ only when a
   * request fails inside a batch: its rows are then in pytorch_backend's batch_stats, not in ours (a
   * request refused by the check never reached forward; a group libtorch refused computed nothing). */
  lab_fw::report(instance, requests, slots, stamps);
  return nullptr; /* every batch and result tensor is freed with 'groups', here: nothing to leak */
}

}  // extern "C"
