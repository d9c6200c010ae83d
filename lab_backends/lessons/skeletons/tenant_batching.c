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
 * Helpers you may use (include/lab_backend_util.h, next to this file): lab_errorf, LAB_RETURN_IF_ERROR,
 * LAB_LOG; request_tenant below. The API: include/lab_triton.h (its last section).
 */
#include "lab_backend_util.h"

#define STRATEGY "tenant_batching"
#define KEY "tenant"

/* One batch being formed. TODO(exercise): what must a batch remember to refuse another tenant? */
typedef struct {
  uint32_t requests; /* included so far */
} Batch;

/* The request's tenant: its "tenant" string parameter, or "" when it has none. The text belongs to
 * the request (it lives as long as the request does): copy it to keep it. */
static LAB_UNUSED TRITONSERVER_Error* request_tenant(TRITONBACKEND_Request* request, const char** tenant) {
  *tenant = "";
  uint32_t count = 0;
  LAB_RETURN_IF_ERROR(TRITONBACKEND_RequestParameterCount(request, &count));
  for (uint32_t i = 0; i < count; ++i) {
    const char* key = NULL;
    TRITONSERVER_ParameterType type = TRITONSERVER_PARAMETER_INT;
    const void* value = NULL;
    LAB_RETURN_IF_ERROR(TRITONBACKEND_RequestParameter(request, i, &key, &type, &value));
    if (strcmp(key, KEY) == 0 && type == TRITONSERVER_PARAMETER_STRING) {
      *tenant = value;
      return NULL;
    }
  }
  return NULL;
}

TRITONSERVER_Error* TRITONBACKEND_ModelBatcherInitialize(TRITONBACKEND_Batcher** batcher,
                                                         TRITONBACKEND_Model* model) {
  (void)model;
  *batcher = NULL; /* nothing to share between batches: no parameters to read */
  return NULL;
}

TRITONSERVER_Error* TRITONBACKEND_ModelBatcherFinalize(TRITONBACKEND_Batcher* batcher) {
  (void)batcher; /* BatcherInitialize allocated nothing */
  return NULL;
}

TRITONSERVER_Error* TRITONBACKEND_ModelBatchInitialize(const TRITONBACKEND_Batcher* batcher, void** userp) {
  (void)batcher;
  Batch* batch = calloc(1, sizeof *batch);
  *userp = batch;
  if (batch == NULL) {
    return lab_errorf(TRITONSERVER_ERROR_INTERNAL, "%s: out of memory for a batch", STRATEGY);
  }
  return NULL;
}

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
