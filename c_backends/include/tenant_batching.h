/*
 * tenant_batching.h - the part of batching strategy "tenant_batching" (one tenant per batch) that
 * notebook 09b's exercise gives: a request's tenant (request_tenant), and the batcher's load-long
 * state, which this strategy does not need (ModelBatcherInitialize and ModelBatcherFinalize).
 *
 * The other part, the batches (ModelBatchInitialize, ModelBatchIncludeRequest, ModelBatchFinalize),
 * is the exercise: c_backends/batching/tenant_batching/tenant_batching.c is the strategy's own (and
 * the exercise's reference answer), exercises/tenant_batching.c the learner's. Either includes this
 * file once, so this header defines two of the five entry points: the strategy stays one translation
 * unit, as c_backends/batching/call_log/call_log.c needs (it #includes a strategy after renaming the
 * five with macros).
 */
#ifndef LAB_TENANT_BATCHING_H
#define LAB_TENANT_BATCHING_H

#include "lab_backend_util.h"

#define STRATEGY "tenant_batching"
#define KEY "tenant"

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

#endif /* LAB_TENANT_BATCHING_H */
