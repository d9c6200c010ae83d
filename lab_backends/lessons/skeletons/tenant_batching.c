/*
 * tenant_batching.c - a custom batching strategy: one tenant per batch.
 *
 * Notebook 09b's exercise. Complete the three places marked TODO(exercise), then run the check
 * cell (exercises.check("one_tenant_per_batch", ...)). The checker reads what your file frees,
 * builds it with gcc -Wall -Wextra -Werror -Wl,-z,defs, loads it on scheduler_probe (one instance)
 * on a server of its own (a crash cannot hurt yours), sends bursts of requests from several tenants
 * and reads every batch back from the trace.
 *
 * The rule: a request names its tenant in the string request parameter "tenant"
 * (tritonclient: infer(..., parameters={"tenant": "red"})); a request without one belongs to the
 * tenant "" (a group of its own). A batch holds the requests of one tenant only: the first request
 * of a batch decides its tenant, and the batch closes at the first queued request of another one.
 *
 * This file holds the strategy's batches, the three functions Triton calls per batch. The rest, built
 * with it, is include/tenant_batching.h (next to this file): request_tenant, which reads a request's
 * tenant, and the two functions Triton calls once per load, which this strategy does not need.
 *
 * Helpers you may use (include/lab_backend_util.h and include/tenant_batching.h): lab_errorf,
 * LAB_RETURN_IF_ERROR, LAB_LOG, request_tenant, STRATEGY. The API: include/lab_triton.h (its last
 * section).
 */
#include "tenant_batching.h"

/* One batch being formed. TODO(exercise): what must a batch remember to refuse another tenant? */
typedef struct {
  uint32_t requests; /* included so far */
} Batch;

TRITONSERVER_Error* TRITONBACKEND_ModelBatchIncludeRequest(TRITONBACKEND_Request* request, void* userp,
                                                           bool* should_include) {
  /* TODO(exercise): include the first request of a batch and remember its tenant; then include a
   * request only if its tenant is the batch's. As it stands every request joins (the plain batcher). */
  (void)request;
  Batch* batch = userp;
  *should_include = true;
  if (batch != NULL) batch->requests += 1;
  return NULL;
}

TRITONSERVER_Error* TRITONBACKEND_ModelBatchFinalize(void* userp) {
  /* TODO(exercise): free what this batch allocated (this frees the Batch only). */
  free(userp);
  return NULL;
}

/* Given: each batch's state, a zeroed Batch (what you add to it starts as 0 or NULL). */
TRITONSERVER_Error* TRITONBACKEND_ModelBatchInitialize(const TRITONBACKEND_Batcher* batcher, void** userp) {
  (void)batcher;
  *userp = calloc(1, sizeof(Batch)); /* zeroed: no requests yet */
  return *userp != NULL ? NULL : lab_errorf(TRITONSERVER_ERROR_INTERNAL, "%s: no memory", STRATEGY);
}
