"""Audit cases of ``executorch_binding`` (notebook 09d): the binding of ExecuTorch's runtime in lab_executorch.

The reference is the backend's own binding (c_backends/frameworks/lab_executorch/lab_executorch_binding.cc),
which the checker builds with the rest of lab_executorch as it builds an answer. Each wrong answer is the
reference with one fault a learner writes put in (written to a scratch folder that lives as long as the
process); the checker builds and serves each one. The memory error is a write past b->input by the rest of
the backend, a fixed number of bytes on every run: ASan names it the same way each time.
"""

from lab_backends.lessons.exercises.audit import SourceVariants, Wrong
from lab_backends.lessons.exercises.registry import load_solution

REFERENCE = load_solution("executorch_binding").read_text()
_SOURCES = SourceVariants(REFERENCE, "et-binding", suffix=".cc")
_variant = _SOURCES.variant

OUTPUT_CHECK = '''  if (why.empty()) why = check_tensor(*b, "output", out.get(), b->spec.output);\n'''
BOUND_CHECK = "  if (b->spec.max_batch_size > b->max_rows) {"
TYPE_CHECK = "  if (info.scalar_type() != t.type) {"
INPUT_SIZE = "  b->input.assign(in->nbytes(), 0); /* the bound's rows: planned from the metadata, not guessed */"
PLANNED = "    b->planned[i].assign(static_cast<size_t>(meta.memory_planned_buffer_size(i).get()), 0);"
EXECUTE = """  err = b->method->execute();
  if (err != Error::Ok) {
    return where(*b) + "execute failed (" + std::string(executorch::runtime::to_string(err)) + ")";
  }
"""
ROWS_CHECK = ("  if (out.dim() < 1 || out.size(0) != rows || "
              "out.nbytes() != static_cast<size_t>(rows) * b->out_row_bytes) {")
GET_OUTPUT = """  const executorch::runtime::EValue& value = b->method->get_output(0);
  if (!value.isTensor()) return where(*b) + "the method's output is not a tensor";
  const executorch::aten::Tensor out = value.toTensor();"""
PLAN = """  const size_t count = meta.num_memory_planned_buffers();
  b->planned.resize(count);
  b->planned_spans.resize(count);
  for (size_t i = 0; i < count; ++i) {
    b->planned[i].assign(static_cast<size_t>(meta.memory_planned_buffer_size(i).get()), 0);
    b->planned_spans[i] = Span<uint8_t>(b->planned[i].data(), b->planned[i].size());
  }"""

REFUSAL = "  if (!why.empty()) return why;\n  /* The first size"
GENERIC_REFUSAL = '  if (!why.empty()) return where(*b) + "the config does not match the program";\n  /* The first size'
BOUND = "  b->max_rows = in->sizes()[0];"
DIMS_LOOP = "fits = sizes[d + 1] == t.dims[d];"
DIMS_FROM_FIRST = "fits = sizes[d] == t.dims[d];"
ROWS_SET = "  b->in_sizes[0] = static_cast<executorch::aten::SizesType>(rows);\n"
#: The planned buffers in a vector of plan_memory()'s own, gone when it returns; the spans still point there.
LOCAL_PLAN = """  const size_t count = meta.num_memory_planned_buffers();
  std::vector<std::vector<uint8_t>> planned(count);
  b->planned_spans.resize(count);
  for (size_t i = 0; i < count; ++i) {
    planned[i].assign(static_cast<size_t>(meta.memory_planned_buffer_size(i).get()), 0);
    b->planned_spans[i] = Span<uint8_t>(planned[i].data(), planned[i].size());
  }"""

WRONG = [
    Wrong("checks the input against the config, never the output",
          _variant("output_unchecked", (OUTPUT_CHECK, "")),
          r"a config with output dims \[9\] loaded, but the program says otherwise"),
    Wrong("never compares max_batch_size with the program's batch bound",
          _variant("bound_unchecked", (BOUND_CHECK, "  if (false) {")),
          r"a config with max_batch_size 128 loaded, but the program says otherwise"),
    Wrong("checks the dims but not the type",
          _variant("type_unchecked", (TYPE_CHECK, "  if (false) {")),
          r"a config with input data_type TYPE_FP64 loaded"),
    Wrong("sizes the planned buffer by the input's bytes, a guess, not memory_planned_buffer_size",
          _variant("planned_by_guess", (PLANNED, "    b->planned[i].assign(b->input.size(), 0);")),
          r"could not load digits_et's program with your binding: .*memory_planned_buffer_size"),
    Wrong("sizes b->input for one row, not the bound's rows: the gather writes past it",
          _variant("input_one_row", (INPUT_SIZE, "  b->input.assign(b->in_row_bytes, 0);")),
          r"AddressSanitizer found a heap-buffer-overflow \(WRITE of size \d+.*in check_and_gather\(\) at "
          r"lab_executorch\.cc:\d+"),
    Wrong("sets the input and reads the output, but never executes the method",
          _variant("no_execute", (EXECUTE, ""), (ROWS_CHECK, "  if (out.dim() < 1) {")),
          r"the logits differ from digits_et's by [\d.e+-]+ \(all zeros\).*execute the method"),
    Wrong("plans the memory into vectors local to plan_memory(): the method computes in freed memory",
          _variant("planned_local", (PLAN, LOCAL_PLAN)),
          # ASan's kind depends on what reused the freed arena (heap-buffer-overflow here, 3 runs of 3): the
          # verdict is the ASan report in run() plus the advice that names the fault.
          r"AddressSanitizer found a heap-[a-z-]+ .*one request of 1 row alone: your binding runs inside the "
          r"server\. Look for memory the method points into that bind\(\) let go"),
    Wrong("refuses a contradicting config with a line that names neither the tensor nor the fix",
          _variant("generic_refusal", (REFUSAL, GENERIC_REFUSAL)),
          r"a config with output dims \[9\] failed to load, but its message does not name 'LOGITS'"),
    Wrong("takes the batch bound from the config's max_batch_size, not from the program's input sizes",
          _variant("bound_from_config", (BOUND, "  b->max_rows = b->spec.max_batch_size;")),
          r"a config with max_batch_size 128 loaded, but the program says otherwise"),
    Wrong("compares the config's dims with the program's sizes from the first (the batch bound), not the second",
          _variant("batch_not_skipped", (DIMS_LOOP, DIMS_FROM_FIRST)),
          r"could not load digits_et's program with your binding: .*output 'LOGITS' has dims \[10\].*"
          r"compare the sizes after the first"),
    Wrong("never sets in_sizes[0] to this batch's rows (and trusts the output's size)",
          _variant("rows_never_set", (ROWS_SET, ""), (ROWS_CHECK, "  if (out.dim() < 1) {")),
          r"one request of 1 row alone: the logits differ from digits_et's by [\d.e+-]+ \(all zeros\)"
          r".*in_sizes\[0\] = rows"),
]

#: One arena for every planned buffer (each span at a 64-byte aligned offset of b->planned[0]), and the
#: output read with get_outputs into an EValue of our own, its rows checked by numel.
ONE_ARENA = """  const size_t count = meta.num_memory_planned_buffers();
  std::vector<size_t> offsets(count);
  size_t total = 0;
  for (size_t i = 0; i < count; ++i) {
    offsets[i] = total;
    total += (static_cast<size_t>(meta.memory_planned_buffer_size(i).get()) + 63) / 64 * 64;
  }
  b->planned.assign(1, std::vector<uint8_t>(total + 64, 0));
  uint8_t* base = b->planned[0].data();
  base += (64 - reinterpret_cast<uintptr_t>(base) % 64) % 64;
  b->planned_spans.clear();
  for (size_t i = 0; i < count; ++i) {
    b->planned_spans.emplace_back(base + offsets[i], static_cast<size_t>(meta.memory_planned_buffer_size(i).get()));
  }"""
OWN_EVALUE = """  executorch::runtime::EValue value;
  if (b->method->get_outputs(&value, 1) != Error::Ok || !value.isTensor()) {
    return where(*b) + "the method gave no tensor output";
  }
  const executorch::aten::Tensor out = value.toTensor();"""

#: The input tensor described anew in run() (no b->in_sizes, b->in_dim_order, b->in_strides), and the
#: row bytes read from the program's metadata (a tensor's bytes over its first size), not the config.
_START = REFERENCE.index("  /* The input's description")
DESCRIPTION = REFERENCE[_START:REFERENCE.index('  return "";\n}', _START)]
TENSOR = """  b->in_sizes[0] = static_cast<executorch::aten::SizesType>(rows);
  executorch::aten::TensorImpl impl(b->spec.input.type, static_cast<ssize_t>(b->in_sizes.size()), b->in_sizes.data(),
                                    b->input.data(), b->in_dim_order.data(), b->in_strides.data());"""
LOCAL_TENSOR = """  const size_t rank = b->spec.input.dims.size() + 1;
  std::vector<executorch::aten::SizesType> sizes(rank);
  std::vector<executorch::aten::DimOrderType> order(rank);
  std::vector<executorch::aten::StridesType> strides(rank, 1);
  sizes[0] = static_cast<executorch::aten::SizesType>(rows);
  for (size_t d = 1; d < rank; ++d) sizes[d] = static_cast<executorch::aten::SizesType>(b->spec.input.dims[d - 1]);
  for (size_t d = 0; d < rank; ++d) order[d] = static_cast<executorch::aten::DimOrderType>(d);
  for (size_t d = rank - 1; d > 0; --d) strides[d - 1] = strides[d] * sizes[d];
  executorch::aten::TensorImpl impl(b->spec.input.type, static_cast<ssize_t>(rank), sizes.data(), b->input.data(),
                                    order.data(), strides.data());"""
ROW_BYTES = """  b->in_row_bytes = row_bytes(b->spec.input);
  b->out_row_bytes = row_bytes(b->spec.output);"""
ROW_BYTES_HELPER = "size_t row_bytes(const ConfigTensor& t) {"
METADATA_ROW_BYTES = """  b->in_row_bytes = in->nbytes() / static_cast<size_t>(b->max_rows);
  b->out_row_bytes = out->nbytes() / static_cast<size_t>(out->sizes()[0]);"""

ALTERNATIVES = [
    _variant("one_arena_own_evalue", (PLAN, ONE_ARENA), (GET_OUTPUT, OWN_EVALUE)),
    _variant("tensor_in_run_rows_from_metadata", (DESCRIPTION, ""), (TENSOR, LOCAL_TENSOR),
             (ROW_BYTES, METADATA_ROW_BYTES), (ROW_BYTES_HELPER, "[[maybe_unused]] " + ROW_BYTES_HELPER)),
]
