/*
 * lab_executorch_binding.cc - ExecuTorch's runtime behind lab_executorch (see lab_executorch_binding.h).
 *
 * What Triton needs from any runtime, and where ExecuTorch gives it (headers under
 * executorch/include/executorch/ in the executorch wheel):
 *   load     Program::load over a DataLoader (runtime/executor/program.h), one per instance here;
 *   check    Program::method_meta -> MethodMeta: the method's inputs and outputs, by position, with
 *            their scalar types and sizes (runtime/executor/method_meta.h). A .pte has no tensor names:
 *            the config's names are Triton's, its types and dims are checked against these;
 *   memory   MethodMeta::memory_planned_buffer_size(i): the export planned every tensor the method
 *            holds into one or a few arenas, which we hand it (HierarchicalAllocator), with an allocator
 *            for its own structures (MemoryManager). A delegate allocates for itself: digits_et's plan
 *            is its input and output at the bound only (notebook 09d checks it); XNNPACK packs the
 *            weights and keeps its layers' intermediates in memory of its own, made at the load;
 *   inputs   Method::set_input with a tensor over our gathered rows: a dynamic batch dimension lets
 *            it take any row count up to the exported bound (it resizes and copies into its arena,
 *            where the export planned the input, as to_executorch does by default; an input left
 *            unplanned would alias b->input instead, runtime/executor/method.h at set_input);
 *   execute  Method::execute, once per batch;
 *   outputs  Method::get_output: a tensor in the method's arena, valid until the next execute;
 *   errors   every call returns an Error code (runtime/core/error.h): nothing throws.
 */
#include "lab_executorch_binding.h"

#include <cstring>

#include <executorch/runtime/core/exec_aten/util/scalar_type_util.h>

namespace lab_et {

using executorch::runtime::Error;
using executorch::runtime::MethodMeta;
using executorch::runtime::Result;
using executorch::runtime::Span;
using executorch::runtime::TensorInfo;

namespace {

std::string where(const Binding& b) { return "lab_executorch: model '" + b.spec.model + "': "; }

std::string sizes_text(Span<const int32_t> sizes) {
  std::string text = "[";
  for (size_t d = 0; d < sizes.size(); ++d) text += (d ? ", " : "") + std::to_string(sizes[d]);
  return text + "]";
}

std::string dims_text(const std::vector<int64_t>& dims) {
  std::string text = "[";
  for (size_t d = 0; d < dims.size(); ++d) text += (d ? ", " : "") + std::to_string(dims[d]);
  return text + "]";
}

/* The config's name for a scalar type, for a fix the learner can paste ("TYPE_FP32"). */
std::string config_type(ScalarType type) {
  switch (type) {
    case ScalarType::Float: return "TYPE_FP32";
    case ScalarType::Double: return "TYPE_FP64";
    case ScalarType::Half: return "TYPE_FP16";
    case ScalarType::Char: return "TYPE_INT8";
    case ScalarType::Int: return "TYPE_INT32";
    case ScalarType::Long: return "TYPE_INT64";
    case ScalarType::Byte: return "TYPE_UINT8";
    case ScalarType::Bool: return "TYPE_BOOL";
    default: return std::string("no Triton type (") + executorch::runtime::toString(type) + ")";
  }
}

/* Bytes of one row: the element size times the config's dims. */
size_t row_bytes(const ConfigTensor& t) {
  size_t bytes = executorch::runtime::elementSize(t.type);
  for (int64_t d : t.dims) bytes *= static_cast<size_t>(d);
  return bytes;
}

/* Does the method's tensor `info` (its `role` 'input' or 'output') match the config's tensor `t`:
 * its type, its rank (the config's dims plus the batch dimension), each dim after the batch? */
std::string check_tensor(const Binding& b, const char* role, const TensorInfo& info, const ConfigTensor& t) {
  const std::string fix_in = " in " + b.spec.config_file;
  if (info.scalar_type() != t.type) {
    return where(b) + role + " '" + t.name + "' is " + t.config_type + fix_in + ", but " + b.spec.program_file +
           " computes " + executorch::runtime::toString(info.scalar_type()) + "; set data_type: " +
           config_type(info.scalar_type()) + " for '" + t.name + "'" + fix_in;
  }
  Span<const int32_t> sizes = info.sizes();
  bool fits = sizes.size() == t.dims.size() + 1;
  for (size_t d = 0; fits && d < t.dims.size(); ++d) fits = sizes[d + 1] == t.dims[d];
  if (!fits) {
    return where(b) + role + " '" + t.name + "' has dims " + dims_text(t.dims) + fix_in + ", but " +
           b.spec.program_file + " has " + sizes_text(sizes) + " (the batch first); set dims to the sizes "
           "after the batch" + fix_in;
  }
  return "";
}

/* The method's one input and one output, against the config. */
std::string check_against_config(Binding* b, const MethodMeta& meta) {
  if (meta.num_inputs() != 1 || meta.num_outputs() != 1) {
    return where(*b) + b->spec.program_file + "'s method '" + b->spec.method + "' takes " +
           std::to_string(meta.num_inputs()) + " input(s) and returns " + std::to_string(meta.num_outputs()) +
           "; this backend serves one tensor in and one out: export a model with one of each";
  }
  Result<TensorInfo> in = meta.input_tensor_meta(0);
  Result<TensorInfo> out = meta.output_tensor_meta(0);
  if (!in.ok() || !out.ok()) {
    return where(*b) + b->spec.program_file + "'s input or output is not a tensor; export a model that takes "
           "and returns one tensor";
  }
  std::string why = check_tensor(*b, "input", in.get(), b->spec.input);
  if (why.empty()) why = check_tensor(*b, "output", out.get(), b->spec.output);
  if (!why.empty()) return why;
  /* The first size is the exported bound of the batch dimension (Dim("batch", max=N)). */
  b->max_rows = in->sizes()[0];
  if (b->spec.max_batch_size > b->max_rows) {
    return where(*b) + "max_batch_size is " + std::to_string(b->spec.max_batch_size) + " in " + b->spec.config_file +
           ", but " + b->spec.program_file + " was exported for at most " + std::to_string(b->max_rows) +
           " rows; set max_batch_size: " + std::to_string(b->max_rows) + " or less, or export with a larger "
           "batch bound";
  }
  b->in_row_bytes = row_bytes(b->spec.input);
  b->out_row_bytes = row_bytes(b->spec.output);
  b->input.assign(in->nbytes(), 0); /* the bound's rows: planned from the metadata, not guessed */
  return "";
}

/* One arena per planned buffer, each exactly the size the export planned. */
void plan_memory(Binding* b, const MethodMeta& meta) {
  const size_t count = meta.num_memory_planned_buffers();
  b->planned.resize(count);
  b->planned_spans.resize(count);
  for (size_t i = 0; i < count; ++i) {
    b->planned[i].assign(static_cast<size_t>(meta.memory_planned_buffer_size(i).get()), 0);
    b->planned_spans[i] = Span<uint8_t>(b->planned[i].data(), b->planned[i].size());
  }
  b->planned_allocator = std::make_unique<executorch::runtime::HierarchicalAllocator>(
      Span<Span<uint8_t>>(b->planned_spans.data(), b->planned_spans.size()));
  b->memory = std::make_unique<executorch::runtime::MemoryManager>(&b->method_allocator, b->planned_allocator.get(),
                                                                  &b->temp_allocator);
}

}  // namespace

}  // namespace lab_et

std::string lab_et::bind(Binding* b) {
  Result<executorch::extension::FileDataLoader> loader =
      executorch::extension::FileDataLoader::from(b->spec.program_file.c_str());
  if (!loader.ok()) {
    return where(*b) + "cannot open " + b->spec.program_file + " (" + executorch::runtime::to_string(loader.error()) +
           "); run `lab-backends setup` to export it, or name the file with default_model_filename in " +
           b->spec.config_file;
  }
  b->loader = std::make_unique<executorch::extension::FileDataLoader>(std::move(loader.get()));
  Result<executorch::runtime::Program> program = executorch::runtime::Program::load(b->loader.get());
  if (!program.ok()) {
    return where(*b) + b->spec.program_file + " is not an ExecuTorch program (" +
           executorch::runtime::to_string(program.error()) + "); export it with to_executorch() (lab-backends setup)";
  }
  b->program = std::make_unique<executorch::runtime::Program>(std::move(program.get()));
  Result<MethodMeta> meta = b->program->method_meta(b->spec.method.c_str());
  if (!meta.ok()) {
    return where(*b) + b->spec.program_file + " has no method '" + b->spec.method + "'; export the model's forward";
  }
  std::string why = check_against_config(b, meta.get());
  if (!why.empty()) return why;
  plan_memory(b, meta.get());
  Result<executorch::runtime::Method> method = b->program->load_method(b->spec.method.c_str(), b->memory.get());
  if (!method.ok()) {
    return where(*b) + "ExecuTorch could not load method '" + b->spec.method + "' of " + b->spec.program_file + " (" +
           executorch::runtime::to_string(method.error()) + "); a kernel or delegate the program needs may be "
           "missing from the libraries this backend links";
  }
  b->method = std::make_unique<executorch::runtime::Method>(std::move(method.get()));
  /* The input's description: contiguous, rank of the config + 1, rows set per run. */
  const size_t rank = b->spec.input.dims.size() + 1;
  b->in_sizes.assign(rank, 0);
  b->in_dim_order.resize(rank);
  b->in_strides.assign(rank, 1);
  for (size_t d = 0; d < rank; ++d) b->in_dim_order[d] = static_cast<executorch::aten::DimOrderType>(d);
  for (size_t d = 1; d < rank; ++d) b->in_sizes[d] = static_cast<executorch::aten::SizesType>(b->spec.input.dims[d - 1]);
  for (size_t d = rank - 1; d > 0; --d) b->in_strides[d - 1] = b->in_strides[d] * b->in_sizes[d];
  return "";
}

std::string lab_et::run(Binding* b, int64_t rows, const uint8_t** output) {
  if (rows < 1 || rows > b->max_rows) {
    return where(*b) + std::to_string(rows) + " rows in one batch, but the program takes 1.." +
           std::to_string(b->max_rows) + "; set max_batch_size to at most " + std::to_string(b->max_rows);
  }
  b->in_sizes[0] = static_cast<executorch::aten::SizesType>(rows);
  executorch::aten::TensorImpl impl(b->spec.input.type, static_cast<ssize_t>(b->in_sizes.size()), b->in_sizes.data(),
                                    b->input.data(), b->in_dim_order.data(), b->in_strides.data());
  Error err = b->method->set_input(executorch::runtime::EValue(executorch::aten::Tensor(&impl)), 0);
  if (err != Error::Ok) {
    return where(*b) + "set_input refused " + std::to_string(rows) + " rows (" + executorch::runtime::to_string(err) + ")";
  }
  err = b->method->execute();
  if (err != Error::Ok) {
    return where(*b) + "execute failed (" + std::string(executorch::runtime::to_string(err)) + ")";
  }
  const executorch::runtime::EValue& value = b->method->get_output(0);
  if (!value.isTensor()) return where(*b) + "the method's output is not a tensor";
  const executorch::aten::Tensor out = value.toTensor();
  if (out.dim() < 1 || out.size(0) != rows || out.nbytes() != static_cast<size_t>(rows) * b->out_row_bytes) {
    return where(*b) + "the method returned " + std::to_string(out.nbytes()) + " bytes for " + std::to_string(rows) +
           " rows; the config's output '" + b->spec.output.name + "' needs " +
           std::to_string(static_cast<size_t>(rows) * b->out_row_bytes);
  }
  *output = out.const_data_ptr<uint8_t>();
  return "";
}
