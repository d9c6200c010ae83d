"""Audit cases of ``tf_gather_scatter`` (notebook 09c): the gather and scatter of the C TensorFlow backend.

The reference is the backend's own gather() and scatter() (c_backends/frameworks/lab_tensorflow/
lab_tensorflow_batch.c), which the checker builds with the rest of lab_tensorflow as it builds an
answer. Each wrong answer is the reference with one fault put in (written to a scratch folder that lives as
long as the process); the checker builds and serves each one. Every fault stays inside the batch
tensor (an offset of ``i`` rows is never past the rows of requests 0..i), so none can crash the
server by luck: each is refused for what it is, on every run.
"""

from lab_backends.lessons import native_exercise
from lab_backends.lessons.exercises.audit import SourceVariants, Wrong
from lab_backends.lessons.exercises.registry import load_solution

REFERENCE = load_solution("tf_gather_scatter").read_text()
_SOURCES = SourceVariants(REFERENCE, "tf-gather")
_file, _variant = _SOURCES.file, _SOURCES.variant

GATHER_START = "/* Step 2, GATHER:"
COPY = """        : lab_gather_input(BACKEND, &slots[i].input,
                           (char*)TF_TensorData(batch) + slots[i].offset * row_bytes);"""
SKIP_BAD = """    if (err != NULL) {
      fail(s, err);
      continue;
    }
    /* A dim the model leaves open"""

SCATTER_END = """      s->ok = false;
    }
  }
}
"""
SEND = """    err = TRITONBACKEND_ResponseSend(s->response, TRITONSERVER_RESPONSE_COMPLETE_FINAL, NULL);
    s->response = NULL;"""

#: Copies only the first row of a request (its first buffer), as if every request carried one row.
FIRST_ROW = """/* The request's row, from its first buffer. */
static TRITONSERVER_Error* first_row(const LabInput* input, char* dst, uint64_t row_bytes) {
  const void* buffer = NULL;
  uint64_t size = 0;
  TRITONSERVER_MemoryType mem = TRITONSERVER_MEMORY_CPU;
  int64_t mem_id = 0;
  LAB_RETURN_IF_ERROR(TRITONBACKEND_InputBuffer(input->input, 0, &buffer, &size, &mem, &mem_id));
  memcpy(dst, buffer, size < row_bytes ? size : row_bytes);
  return NULL;
}

"""

#: Each request's input first in a TF_Tensor of its own, then copied into the batch; never deleted.
STAGED = """/* The request's rows as a tensor of their own, copied into the batch. */
static TRITONSERVER_Error* staged_copy(const TfInstance* in, const LabInput* input, char* dst) {
  TF_Tensor* rows = TF_AllocateTensor(TYPES[type_by_triton(in->model->input.dtype)].tf, input->shape,
                                      (int)input->dims, (size_t)input->byte_size);
  if (rows == NULL) return tf_errorf(TRITONSERVER_ERROR_INTERNAL, "%s: out of memory", BACKEND);
  LAB_RETURN_IF_ERROR(lab_gather_input(BACKEND, input, TF_TensorData(rows)));
  memcpy(dst, TF_TensorData(rows), TF_TensorByteSize(rows));
  return NULL;
}

"""

MALLOCED = """/* The request's rows in a buffer of their own, copied into the batch. */
static TRITONSERVER_Error* malloced_copy(const LabInput* input, char* dst) {
  char* rows = malloc((size_t)input->byte_size);
  if (rows == NULL) return tf_errorf(TRITONSERVER_ERROR_INTERNAL, "%s: out of memory", BACKEND);
  LAB_RETURN_IF_ERROR(lab_gather_input(BACKEND, input, rows));
  memcpy(dst, rows, (size_t)input->byte_size);
  return NULL;
}

"""

WRONG = [
    Wrong("gathers request i at row i, as if the requests before it carried one row each",
          _variant("row_i", (COPY, COPY.replace("slots[i].offset * row_bytes", "i * row_bytes"))),
          r"rows shifted between requests"),
    Wrong("gathers one row per request (its first), whatever its own batch size",
          _variant("one_row", (GATHER_START, FIRST_ROW + GATHER_START),
                   ("    s->rows = (uint64_t)s->input.shape[0];", "    s->rows = 1;"),
                   (COPY, """        : first_row(&slots[i].input,
                    (char*)TF_TensorData(batch) + slots[i].offset * row_bytes, row_bytes);""")),
          r"a request of 5 rows got LOGITS of shape \[1, 10\].*not one row per request"),
    Wrong("stages each request in a TF_Tensor of its own and never deletes it: a leak per batch",
          _variant("leaks_tensor", (GATHER_START, STAGED + GATHER_START),
                   (COPY, """        : staged_copy(in, &slots[i].input,
                      (char*)TF_TensorData(batch) + slots[i].offset * row_bytes);""")),
          r"your backend holds \d+ more blocks than after its first request .*something is leaked per request"),
    Wrong("stages each request in a malloc'd buffer and never frees it",
          _variant("leaks_buffer", (GATHER_START, MALLOCED + GATHER_START),
                   (COPY, """        : malloced_copy(&slots[i].input,
                        (char*)TF_TensorData(batch) + slots[i].offset * row_bytes);""")),
          r"your backend holds \d+ more blocks than after its first request .*every malloc its free"),
    Wrong("gives up the whole batch when one request's rows do not fit",
          _variant("fails_batch", (SKIP_BAD, SKIP_BAD.replace("      continue;", "      return NULL;"))),
          r"failed although its rows were fine.*must not fail its batch"),
    # A learner's own (issue 47): one row per request at the request's index, the whole input still copied: the
    # 5-row request writes 1280 bytes into a 256-byte batch. Without AddressSanitizer glibc later found the heap
    # corrupted, the server's signal handler hung and the check waited for ever.
    Wrong("assumes one row per request: offset = request index, the whole input still copied past the batch",
          _variant("one_row_per_request", ("    s->rows = (uint64_t)s->input.shape[0];\n    s->offset = *total;\n"
                                           "    *total += s->rows;",
                                           "    s->rows = 1;\n    s->offset = i;\n    *total += 1;")),
          r"AddressSanitizer found a heap-buffer-overflow \(WRITE of size 1280.*256-byte block\) in gather\(\) "
          r"at [\w.-]+\.c:\d+"),
    Wrong("deletes the result tensor at the end of scatter, which Execute deletes too",
          _variant("result_deleted_twice",
                   (SCATTER_END, SCATTER_END[:-2] + "  TF_DeleteTensor((TF_Tensor*)result);\n}\n")),
          r"AddressSanitizer found a .* in TRITONBACKEND_ModelInstanceExecute\(\) at [\w.-]+\.c:\d+.*deleted twice"),
    Wrong("frees each response after sending it, as if it were still the backend's",
          _variant("response_deleted_after_send", (SEND, SEND.replace("    s->response = NULL;",
                                                                     "    TRITONBACKEND_ResponseDelete(s->response);\n"
                                                                     "    s->response = NULL;"))),
          r"AddressSanitizer found a double-free .* in scatter\(\) at [\w.-]+\.c:\d+"),
    Wrong("an unused variable (a warning, so -Werror fails the build)",
          _variant("warning", ("  int64_t row[TF_MAX_DIMS];\n  bool shape_fixed = false;",
                               "  int64_t row[TF_MAX_DIMS];\n  int unused = 0;\n  bool shape_fixed = false;")),
          r"does not build.*unused variable"),
]

_HEADER = native_exercise.SKELETON.read_text().split("*/", 1)[0] + "*/\n"


def _function(name: str) -> str:
    """The reference's step comment and function ``name``, up to the next step's comment (or the end)."""
    start = REFERENCE.index({"gather": GATHER_START, "scatter": "/* Step 4, SCATTER:"}[name])
    return REFERENCE[start:REFERENCE.index("/* Step 4, SCATTER:")] if name == "gather" else REFERENCE[start:]


#: Two passes over the requests without the batch's own bookkeeping helpers: the buffer is the
#: learner's (aligned_alloc, handed to TF_NewTensor with a deallocator that frees it), each input is
#: copied buffer by buffer, and the scatter walks the result with a pointer, its row size computed
#: from the output's dims and type.
OWN_BUFFER_GATHER = """/* Step 2, GATHER, with a buffer of our own. */
static void free_batch(void* data, size_t length, void* arg) {
  (void)length;
  (void)arg;
  free(data);
}

TF_Tensor* gather(const TfInstance* in, Slot* slots, uint32_t count, uint64_t* total) {
  const TfModel* m = in->model;
  uint64_t row_elements = 1;
  int64_t dims[TF_MAX_DIMS];
  for (int d = 0; d < m->input.dims; ++d) {
    dims[d + 1] = in->row_shape[d];
    row_elements *= (uint64_t)in->row_shape[d];
  }
  uint64_t rows = 0;
  for (uint32_t i = 0; i < count; ++i) {
    if (!slots[i].ok) continue;
    if (memcmp(slots[i].input.shape + 1, in->row_shape, sizeof(int64_t) * (size_t)m->input.dims) != 0) {
      fail(&slots[i], tf_errorf(TRITONSERVER_ERROR_INVALID_ARG, "%s: input '%s' has rows of another "
                                "shape than the model takes", BACKEND, m->input.name));
      continue;
    }
    slots[i].offset = rows;
    slots[i].rows = (uint64_t)slots[i].input.shape[0];
    rows += slots[i].rows;
  }
  *total = rows;
  if (rows == 0) return NULL;
  size_t row_bytes = (size_t)(row_elements * lab_dtype_size(m->input.dtype));
  size_t bytes = (size_t)rows * row_bytes;
  char* data = aligned_alloc(64, (bytes + 63) / 64 * 64);
  if (data == NULL) return NULL;
  for (uint32_t i = 0; i < count; ++i) {
    if (!slots[i].ok) continue;
    char* dst = data + slots[i].offset * row_bytes;
    for (uint32_t b = 0; b < slots[i].input.buffers; ++b) {
      const void* buffer = NULL;
      uint64_t size = 0;
      TRITONSERVER_MemoryType mem = TRITONSERVER_MEMORY_CPU;
      int64_t mem_id = 0;
      TRITONSERVER_Error* err = TRITONBACKEND_InputBuffer(slots[i].input.input, b, &buffer, &size, &mem, &mem_id);
      if (err != NULL) {
        fail(&slots[i], err);
        break;
      }
      memcpy(dst, buffer, size);
      dst += size;
    }
  }
  dims[0] = (int64_t)rows;
  return TF_NewTensor(TYPES[type_by_triton(m->input.dtype)].tf, dims, m->input.dims + 1, data, bytes,
                      free_batch, NULL);
}

"""

POINTER_SCATTER = """/* Step 4, SCATTER, walking the result. */
void scatter(const TfInstance* in, const TF_Tensor* result, Slot* slots, uint32_t count, uint64_t total) {
  (void)total;
  const ConfigTensor* t = &in->model->output;
  int64_t shape[TF_MAX_DIMS];
  uint64_t row_bytes = lab_dtype_size(t->dtype);
  for (int d = 1; d <= t->dims; ++d) {
    shape[d] = TF_Dim(result, d);
    row_bytes *= (uint64_t)shape[d];
  }
  const char* next = TF_TensorData(result);
  for (uint32_t i = 0; i < count; ++i) {
    if (!slots[i].ok) continue;
    const char* mine = next;
    next += slots[i].rows * row_bytes;
    shape[0] = (int64_t)slots[i].rows;
    TRITONBACKEND_Output* output = NULL;
    void* buffer = NULL;
    TRITONSERVER_MemoryType mem = TRITONSERVER_MEMORY_CPU;
    int64_t mem_id = 0;
    TRITONSERVER_Error* err = TRITONBACKEND_ResponseOutput(slots[i].response, &output, t->name, t->dtype,
                                                           shape, (uint32_t)t->dims + 1);
    if (err == NULL) err = TRITONBACKEND_OutputBuffer(output, &buffer, slots[i].rows * row_bytes, &mem, &mem_id);
    if (err != NULL) {
      fail(&slots[i], err);
      continue;
    }
    memcpy(buffer, mine, slots[i].rows * row_bytes);
    err = TRITONBACKEND_ResponseSend(slots[i].response, TRITONSERVER_RESPONSE_COMPLETE_FINAL, NULL);
    slots[i].response = NULL;
    if (err != NULL) {
      LAB_LOG(TRITONSERVER_LOG_ERROR, "%s: send failed: %s", BACKEND, TRITONSERVER_ErrorMessage(err));
      TRITONSERVER_ErrorDelete(err);
      slots[i].ok = false;
    }
  }
}

"""

ALTERNATIVES = [
    # The skeleton's header comment, TODO(exercise) marks and all, kept above a finished file.
    _file("with_header", _HEADER + REFERENCE),
    # The batch in a buffer of its own (TF_NewTensor + a deallocator), copied buffer by buffer; the
    # scatter walks the result with a pointer. The slots' offsets are still set: the scatter of
    # slot i depends only on the rows before it, which the pointer adds up the same way.
    _variant("own_buffer", (_function("gather"), OWN_BUFFER_GATHER), (_function("scatter"), POINTER_SCATTER)),
]
