/*
 * tenant_batching.c - a custom batching strategy: one tenant per batch (reference solution).
 *
 * Notebook 09b's exercise. A request names its tenant in the string request parameter "tenant"
 * (tritonclient: infer(..., parameters={"tenant": "red"})); a request without one belongs to the
 * tenant "" (a group of its own). A batch holds the requests of one tenant only: the first request
 * of a batch decides its tenant, and the batch closes at the first queued request of another one.
 */
#include "lab_backend_util.h"

#define STRATEGY "tenant_batching"
#define KEY "tenant"

/* One batch being formed. */
typedef struct {
  char* tenant;      /* a copy of the first request's tenant (ours: freed in ModelBatchFinalize) */
  uint32_t requests; /* included so far */
} Batch;

/* The request's tenant: its "tenant" string parameter, or "" when it has none. The text belongs to
 * the request (it lives as long as the request does): copy it to keep it. */
static TRITONSERVER_Error* request_tenant(TRITONBACKEND_Request* request, const char** tenant) {
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
