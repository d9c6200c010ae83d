/*
 * lab_tensorflow_batch.c - the GATHER and the SCATTER of backend "lab_tensorflow" (the rest is
 * lab_tensorflow.c; lab_tensorflow.h holds what both share).
 *
 * Execute's batch goes from Triton's request buffers into one TF_Tensor (gather), through
 * TF_SessionRun once, and back into each request's response (scatter): what backend
 * src/backend_input_collector.cc and src/backend_output_responder.cc do for Triton's own framework
 * backends (pytorch_backend src/libtorch.cc ProcessRequests at r24.10). Notebook 09c's exercise asks
 * for these two functions: its checker builds the learner's file in place of this one, with
 * lab_tensorflow.c, as lab_backends/server/native_backends.py builds this one; this file is the
 * exercise's reference answer.
 */
#include "lab_tensorflow.h"

/* Step 2, GATHER: one TF_Tensor [total rows, row shape...] holding every good request's rows, each
 * at its offset. A request whose rows the model cannot take fails alone (its batch-mates go on); a
 * request may carry several rows (its own batch size, the first dimension of its input), so a
 * request's offset is the sum of the rows before it; its input may arrive in several buffers
 * (lab_gather_input copies them in turn). Sets *total; NULL when nothing is left to run (or no
 * memory: every request still pending is then answered by Execute). */
TF_Tensor* gather(const TfInstance* in, Slot* slots, uint32_t count, uint64_t* total) {
  const TfModel* m = in->model;
  int64_t row[TF_MAX_DIMS];
  bool shape_fixed = false;
  memcpy(row, in->row_shape, sizeof in->row_shape);
  *total = 0;
  for (uint32_t i = 0; i < count; ++i) {
    Slot* s = &slots[i];
    if (!s->ok) continue;
    TRITONSERVER_Error* err = NULL;
    for (int d = 0; err == NULL && d < m->input.dims; ++d) {
      if (row[d] >= 0 && s->input.shape[d + 1] != row[d]) {
        char want[96], have[96];
        err = tf_errorf(TRITONSERVER_ERROR_INVALID_ARG,
                        "%s: input '%s' has shape %s, but the model takes rows of %s%s; send rows "
                        "of that shape", BACKEND, m->input.name,
                        shape_text(s->input.shape, (int)s->input.dims, have, sizeof have),
                        shape_text(row, m->input.dims, want, sizeof want),
                        shape_fixed ? " in this batch" : "");
      }
    }
    if (err != NULL) {
      fail(s, err);
      continue;
    }
    /* A dim the model leaves open is fixed by the first good request: one tensor, one shape. */
    for (int d = 0; d < m->input.dims; ++d) row[d] = s->input.shape[d + 1];
    shape_fixed = true;
    s->rows = (uint64_t)s->input.shape[0];
    s->offset = *total;
    *total += s->rows;
  }
  if (*total == 0) return NULL;
  int64_t dims[TF_MAX_DIMS];
  dims[0] = (int64_t)*total;
  uint64_t row_elements = 1;
  for (int d = 0; d < m->input.dims; ++d) {
    dims[d + 1] = row[d];
    row_elements *= (uint64_t)row[d]; /* bounded: each request's product was checked */
  }
  uint64_t row_bytes = row_elements * lab_dtype_size(m->input.dtype);
  TF_Tensor* batch = TF_AllocateTensor(TYPES[type_by_triton(m->input.dtype)].tf, dims,
                                       m->input.dims + 1, (size_t)(*total * row_bytes));
  for (uint32_t i = 0; i < count; ++i) {
    if (!slots[i].ok) continue;
    TRITONSERVER_Error* err = batch == NULL
        ? tf_errorf(TRITONSERVER_ERROR_INTERNAL, "%s: out of memory for a batch of %llu rows",
                    BACKEND, (unsigned long long)*total)
        : lab_gather_input(BACKEND, &slots[i].input,
                           (char*)TF_TensorData(batch) + slots[i].offset * row_bytes);
    if (err != NULL) fail(&slots[i], err);
  }
  return batch;
}

/* Step 4, SCATTER: each request's rows of the result into its own response, shaped
 * [its rows, output dims...], and sent. */
void scatter(const TfInstance* in, const TF_Tensor* result, Slot* slots, uint32_t count,
             uint64_t total) {
  const ConfigTensor* t = &in->model->output;
  int64_t shape[TF_MAX_DIMS];
  for (int d = 0; d < t->dims; ++d) shape[d + 1] = TF_Dim(result, d + 1);
  size_t row_bytes = TF_TensorByteSize(result) / (size_t)total;
  const char* data = TF_TensorData(result);
  for (uint32_t i = 0; i < count; ++i) {
    Slot* s = &slots[i];
    if (!s->ok) continue;
    shape[0] = (int64_t)s->rows;
    TRITONBACKEND_Output* output = NULL;
    void* buffer = NULL;
    TRITONSERVER_MemoryType mem = TRITONSERVER_MEMORY_CPU;
    int64_t mem_id = 0;
    uint64_t bytes = s->rows * row_bytes;
    TRITONSERVER_Error* err = TRITONBACKEND_ResponseOutput(s->response, &output, t->name, t->dtype,
                                                           shape, (uint32_t)t->dims + 1);
    if (err == NULL) err = TRITONBACKEND_OutputBuffer(output, &buffer, bytes, &mem, &mem_id);
    if (err == NULL && mem == TRITONSERVER_MEMORY_GPU) {
      err = tf_errorf(TRITONSERVER_ERROR_UNSUPPORTED, "%s: output buffer in GPU memory", BACKEND);
    }
    if (err != NULL) {
      fail(s, err);
      continue;
    }
    memcpy(buffer, data + s->offset * row_bytes, bytes);
    err = TRITONBACKEND_ResponseSend(s->response, TRITONSERVER_RESPONSE_COMPLETE_FINAL, NULL);
    s->response = NULL; /* Triton's now, even if the send failed (lab_triton.h, ResponseSend) */
    if (err != NULL) {
      LAB_LOG(TRITONSERVER_LOG_ERROR, "%s: send failed: %s", BACKEND, TRITONSERVER_ErrorMessage(err));
      TRITONSERVER_ErrorDelete(err);
      s->ok = false;
    }
  }
}
