/*
 * tenant_batching.c - batching strategy "tenant_batching": one tenant per batch.
 *
 * A request names its tenant in the string request parameter "tenant" (tritonclient:
 * infer(..., parameters={"tenant": "red"})); a request without one belongs to the tenant "" (a group
 * of its own). A batch holds the requests of one tenant only: the first request of a batch decides
 * its tenant, and the batch closes at the first queued request of another one.
 *
 * This file is the strategy's batches; tenant_batching.h (c_backends/include/) holds the rest:
 * request_tenant and the batcher's two functions. Notebook 09b's exercise asks for this file's
 * functions (its skeleton is lab_backends/lessons/skeletons/tenant_batching.c): this file is its
 * reference answer, and set-up builds it as a strategy (lab_backends/server/cbackend.py
 * build_all_strategies).
 */
#include "tenant_batching.h"

/* One batch being formed. */
typedef struct {
  char* tenant;      /* a copy of the first request's tenant (ours: freed in ModelBatchFinalize) */
  uint32_t requests; /* included so far */
} Batch;

TRITONSERVER_Error* TRITONBACKEND_ModelBatchInitialize(const TRITONBACKEND_Batcher* batcher, void** userp) {
  (void)batcher;
  *userp = calloc(1, sizeof(Batch)); /* zeroed: no requests yet */
  return *userp != NULL ? NULL : lab_errorf(TRITONSERVER_ERROR_INTERNAL, "%s: no memory", STRATEGY);
}

TRITONSERVER_Error* TRITONBACKEND_ModelBatchIncludeRequest(TRITONBACKEND_Request* request, void* userp,
                                                           bool* should_include) {
  Batch* batch = userp;
  /* Never refuse the first request of a batch: the batcher would ask about it again, forever. */
  *should_include = batch == NULL || batch->requests == 0;
  if (batch == NULL) return NULL;
  const char* tenant = NULL;
  LAB_RETURN_IF_ERROR(request_tenant(request, &tenant));
  if (batch->requests == 0) {
    batch->tenant = strdup(tenant);
    batch->requests = 1;
    if (batch->tenant == NULL) {
      return lab_errorf(TRITONSERVER_ERROR_INTERNAL, "%s: out of memory for a tenant", STRATEGY);
    }
    return NULL;
  }
  *should_include = batch->tenant != NULL && strcmp(batch->tenant, tenant) == 0;
  if (*should_include) batch->requests += 1;
  return NULL;
}

TRITONSERVER_Error* TRITONBACKEND_ModelBatchFinalize(void* userp) {
  Batch* batch = userp;
  if (batch != NULL) {
    free(batch->tenant);
    free(batch);
  }
  return NULL;
}
