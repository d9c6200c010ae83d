/*
 * lab_executorch_binding.h - the binding of ExecuTorch's runtime inside backend "lab_executorch": the part
 * of a framework backend that is new for every framework. lab_executorch.cc speaks to Triton (config,
 * requests, responses, statistics); lab_executorch_binding.cc speaks to the runtime, through these two
 * functions only:
 *
 *   bind(b):         open the program, check its method's tensors against the config, plan its memory
 *                    from the method's own metadata, load the method (once per instance, at load);
 *   run(b, rows, &out): the gathered rows (already in b->input) in, one execute, the output's rows out.
 *
 * Both return "" on success or one line that names the model, the tensor and the fix (the caller
 * turns it into a TRITONSERVER_Error). Nothing here may throw: ExecuTorch reports by Error codes.
 * Notebook 09d hands lab_executorch_binding.cc out as an exercise; this header is given.
 */
#ifndef LAB_EXECUTORCH_BINDING_H
#define LAB_EXECUTORCH_BINDING_H

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <executorch/extension/data_loader/file_data_loader.h>
#include <executorch/extension/memory_allocator/malloc_memory_allocator.h>
#include <executorch/runtime/core/hierarchical_allocator.h>
#include <executorch/runtime/executor/memory_manager.h>
#include <executorch/runtime/executor/method.h>
#include <executorch/runtime/executor/program.h>

namespace lab_et {

using executorch::aten::ScalarType;

/* One tensor of the config: a .pte names no tensors (its method takes and returns them by position),
 * so the config's name is what Triton uses and the type and dims are what the method is checked against. */
struct ConfigTensor {
  std::string name;
  std::string config_type; /* "TYPE_FP32": for messages */
  ScalarType type = ScalarType::Float;
  std::vector<int64_t> dims; /* without the batch dimension; no -1 here (a .pte's sizes are concrete) */
};

/* What the backend read from the config, for the binding. */
struct ModelSpec {
  std::string model;        /* the model's name, first in every message */
  std::string config_file;  /* <model folder>/config.pbtxt, named in every fix */
  std::string program_file; /* <model folder>/<version>/<default_model_filename> */
  std::string method = "forward";
  int64_t max_batch_size = 0; /* the config's: at most this many rows per execute */
  ConfigTensor input, output;
};

/* One instance's runtime: the loaded method and every byte it computes in. Members are declared in the
 * order they must be built; destroyed in reverse, the method goes before the memory it points into. */
struct Binding {
  ModelSpec spec;
  std::unique_ptr<executorch::extension::FileDataLoader> loader;
  std::unique_ptr<executorch::runtime::Program> program;
  /* Memory planned at export: one buffer per planned arena, each sized by the method's metadata. */
  std::vector<std::vector<uint8_t>> planned;
  std::vector<executorch::runtime::Span<uint8_t>> planned_spans;
  std::unique_ptr<executorch::runtime::HierarchicalAllocator> planned_allocator;
  /* The method's own structures (values, instruction chains) and its kernels' scratch. */
  executorch::extension::MallocMemoryAllocator method_allocator;
  executorch::extension::MallocMemoryAllocator temp_allocator;
  std::unique_ptr<executorch::runtime::MemoryManager> memory;
  std::unique_ptr<executorch::runtime::Method> method;
  /* The gathered input: max_rows rows of in_row_bytes, sized from the input's metadata. The caller
   * writes each request's rows at its offset, then calls run(). */
  std::vector<uint8_t> input;
  int64_t max_rows = 0;      /* the exported batch bound (the input's first size in the metadata) */
  size_t in_row_bytes = 0;   /* bytes of one input row */
  size_t out_row_bytes = 0;  /* bytes of one output row */
  /* The input tensor's description handed to set_input: sizes[0] is the batch's rows. */
  std::vector<executorch::aten::SizesType> in_sizes;
  std::vector<executorch::aten::DimOrderType> in_dim_order;
  std::vector<executorch::aten::StridesType> in_strides;
};

/* Load: open, check against the config, plan, load the method. "" or one line with the fix. */
std::string bind(Binding* b);

/* Execute the first `rows` rows of b->input; on success *output points at rows * out_row_bytes bytes
 * of the method's output (valid until the next run). "" or one line. */
std::string run(Binding* b, int64_t rows, const uint8_t** output);

}  // namespace lab_et

#endif /* LAB_EXECUTORCH_BINDING_H */
