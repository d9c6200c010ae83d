/*
 * tf_gather_scatter.c - the gather and the scatter of the backend lab_tensorflow (a TensorFlow
 * SavedModel served inside Triton through TensorFlow's C API): notebook 09c's exercise.
 *
 * Complete the two places marked TODO(exercise), gather() and scatter(), in this file, then run the
 * check cell (exercises.check("tf_gather_scatter", ...)). This file holds only them: the rest of
 * lab_tensorflow (c_backends/frameworks/lab_tensorflow/lab_tensorflow.c: loading the SavedModel,
 * and Execute's RESPONSES, CHECK, RUN with TF_SessionRun once per batch, REPORT and RELEASE) is built
 * with it. Its types (TfInstance, TfModel, ConfigTensor, Slot) and helpers are declared in
 * lab_tensorflow.h, which this file includes: read it in include/, next to this file.
 *
 * What Execute does around your two functions, per batch of `count` requests:
 *   slots[i].response exists and slots[i].input is request i's input, of the model's type and rank
 *   ([rows, row dims...], rows >= 1), for every slots[i].ok; a request that failed that check has
 *   ok == false and is already answered. Then gather(), TF_SessionRun on its tensor, scatter(),
 *   and any request still unanswered gets "the batch could not run". Execute deletes both tensors.
 *
 * The checker builds this file with lab_tensorflow.c (gcc -Wall -Wextra -Werror -Wl,-z,defs
 * against the TensorFlow wheel's C API), serves it as backend "tf_exercise" on a server of its own
 * (a crash cannot hurt yours) with the digits SavedModel, and sends concurrent requests of 1 to 8
 * rows each: every answer must equal digits_tf_native's. It also sends a request whose rows have
 * the wrong length inside a batch (its config lets it through Triton), and many batches, then counts
 * the TF_Tensors and malloc'd blocks the backend's code still holds (a leak per request shows).
 *
 * The model config the checker writes (digits_tf_native's, renamed):
 *   backend: "tf_exercise"   max_batch_size: 64   dynamic_batching { ... }
 *   input  PIXELS TYPE_FP32 dims [-1] (allow_ragged_batch)   output LOGITS TYPE_FP32 dims [10]
 *
 * Helpers you may use (include/lab_tensorflow.h and include/lab_backend_util.h, next to this
 * file): fail, tf_errorf, shape_text, TYPES and type_by_triton, lab_gather_input, lab_dtype_size,
 * LAB_LOG. TensorFlow's C API: TF_AllocateTensor, TF_TensorData, TF_TensorByteSize, TF_Dim,
 * TF_DeleteTensor (tensorflow/c/c_api.h in the wheel; notebook 09c shows where).
 */
#include "lab_tensorflow.h"

/* Step 2, GATHER: one TF_Tensor holding every good request's rows, each at its offset. */
TF_Tensor* gather(const TfInstance* in, Slot* slots, uint32_t count, uint64_t* total) {
  /* TODO(exercise): gather the batch.
   * 1. For every request still ok (slots[i].ok): check that each of its rows has the shape the model
   *    takes (in->row_shape[d], d < in->model->input.dims; -1: any, fixed by the first good request)
   *    against its input's shape (slots[i].input.shape[d + 1]). A request whose rows do not fit is
   *    answered alone: fail(&slots[i], tf_errorf(TRITONSERVER_ERROR_INVALID_ARG, "...")), and the
   *    others go on. A request may carry several rows: its own batch size is
   *    slots[i].input.shape[0]. Set slots[i].rows, slots[i].offset (its first row in the batch)
   *    and *total (the rows of every good request).
   * 2. Allocate one tensor [*total, row shape...]: TF_AllocateTensor(TYPES[type_by_triton(
   *    in->model->input.dtype)].tf, dims, in->model->input.dims + 1, bytes).
   * 3. Copy each good request's input to its offset: lab_gather_input(BACKEND, &slots[i].input,
   *    (char*)TF_TensorData(batch) + <its offset in bytes>); a copy that fails fails its request.
   * Return the tensor (Execute runs it and deletes it), or NULL when no request is left. */
  (void)in;
  (void)slots;
  (void)count;
  *total = 0;
  return NULL;
}

/* Step 4, SCATTER: each request's rows of the result into its own response, and sent. */
void scatter(const TfInstance* in, const TF_Tensor* result, Slot* slots, uint32_t count,
             uint64_t total) {
  /* TODO(exercise): scatter the result ([total rows, output dims...], Execute deletes it).
   * For every request still ok (slots[i].ok): create its output in its response,
   * TRITONBACKEND_ResponseOutput(slots[i].response, &output, in->model->output.name,
   * in->model->output.dtype, shape, in->model->output.dims + 1), shaped [its rows, output dims...]
   * (TF_Dim(result, d)); get its buffer (TRITONBACKEND_OutputBuffer, CPU memory); copy its rows of
   * the result into it (from TF_TensorData(result), at its offset); send it
   * (TRITONBACKEND_ResponseSend(..., TRITONSERVER_RESPONSE_COMPLETE_FINAL, NULL)) and set
   * slots[i].response = NULL: the response is Triton's now, even if the send returned an error
   * (log that error, free it with TRITONSERVER_ErrorDelete and set slots[i].ok = false). A request
   * whose output cannot be made is answered alone: fail(&slots[i], err). Execute answers any
   * request you leave unanswered with "the batch could not run". */
  (void)in;
  (void)result;
  (void)slots;
  (void)count;
  (void)total;
}
