/*
 * call_log.c - a batching strategy that wraps another one and logs every call Triton makes to it.
 *
 * Why: the five functions come in pairs (BatcherInitialize/BatcherFinalize once per load,
 * BatchInitialize/BatchFinalize once per batch, tritonbackend.h at r24.10), and a strategy that
 * allocates in an Initialize frees in its Finalize. Whether Triton really calls them in pairs is a
 * question for the server, not for the header: this wrapper answers it. Each call writes one line
 * to the server log (INFO) and then runs the wrapped strategy unchanged:
 *
 *   batch call log: BatcherInitialize model=<name> -> batcher=<pointer>
 *   batch call log: BatchInitialize batcher=<pointer> -> tally=<pointer>
 *   batch call log: BatchIncludeRequest tally=<pointer> -> 0|1 request=<request id>
 *   batch call log: BatchFinalize tally=<pointer>
 *   batch call log: BatcherFinalize batcher=<pointer>
 *
 * A tally that a BatchInitialize returned and no BatchFinalize received is one Triton never
 * finalized (lab_backends.lessons.strategy_calls pairs them; notebook 09b counts them). The
 * pointers are the strategy's own: Triton only stores and passes them back, so they pair calls
 * exactly (an address is reused only after it was freed, that is after its BatchFinalize).
 *
 * The wrapped source is byte_budget.c, or the file named by -DLAB_WRAPPED_STRATEGY='"path.c"'.
 * Its five functions are renamed with macros before it is included, so this file defines the
 * real entry points and calls them.
 */
#include "lab_backend_util.h" /* first: declares the real names (exported); the guard skips it below */

#ifndef LAB_WRAPPED_STRATEGY
#define LAB_WRAPPED_STRATEGY "../byte_budget/byte_budget.c"
#endif

#define TRITONBACKEND_ModelBatcherInitialize wrapped_ModelBatcherInitialize
#define TRITONBACKEND_ModelBatcherFinalize wrapped_ModelBatcherFinalize
#define TRITONBACKEND_ModelBatchInitialize wrapped_ModelBatchInitialize
#define TRITONBACKEND_ModelBatchIncludeRequest wrapped_ModelBatchIncludeRequest
#define TRITONBACKEND_ModelBatchFinalize wrapped_ModelBatchFinalize
#include LAB_WRAPPED_STRATEGY
#undef TRITONBACKEND_ModelBatcherInitialize
#undef TRITONBACKEND_ModelBatcherFinalize
#undef TRITONBACKEND_ModelBatchInitialize
#undef TRITONBACKEND_ModelBatchIncludeRequest
#undef TRITONBACKEND_ModelBatchFinalize

#define CALL_LOG(...) LAB_LOG(TRITONSERVER_LOG_INFO, "batch call log: " __VA_ARGS__)

TRITONSERVER_Error* TRITONBACKEND_ModelBatcherInitialize(TRITONBACKEND_Batcher** batcher,
                                                         TRITONBACKEND_Model* model) {
  TRITONSERVER_Error* err = wrapped_ModelBatcherInitialize(batcher, model);
  const char* name = "?";
  TRITONSERVER_Error* named = TRITONBACKEND_ModelName(model, &name);
  if (named != NULL) TRITONSERVER_ErrorDelete(named);
  CALL_LOG("BatcherInitialize model=%s -> batcher=%p%s", name, (void*)*batcher, err != NULL ? " (error)" : "");
  return err;
}

TRITONSERVER_Error* TRITONBACKEND_ModelBatcherFinalize(TRITONBACKEND_Batcher* batcher) {
  CALL_LOG("BatcherFinalize batcher=%p", (void*)batcher);
  return wrapped_ModelBatcherFinalize(batcher);
}

TRITONSERVER_Error* TRITONBACKEND_ModelBatchInitialize(const TRITONBACKEND_Batcher* batcher, void** userp) {
  TRITONSERVER_Error* err = wrapped_ModelBatchInitialize(batcher, userp);
  CALL_LOG("BatchInitialize batcher=%p -> tally=%p", (const void*)batcher, *userp);
  return err;
}

TRITONSERVER_Error* TRITONBACKEND_ModelBatchIncludeRequest(TRITONBACKEND_Request* request, void* userp,
                                                           bool* should_include) {
  TRITONSERVER_Error* err = wrapped_ModelBatchIncludeRequest(request, userp, should_include);
  /* The request's id says which request was offered (the exercise checker of notebook 09b reads it). */
  const char* id = NULL;
  TRITONSERVER_Error* named = TRITONBACKEND_RequestId(request, &id);
  if (named != NULL) TRITONSERVER_ErrorDelete(named);
  CALL_LOG("BatchIncludeRequest tally=%p -> %d request=%s", userp, (int)*should_include, id != NULL ? id : "");
  return err;
}

TRITONSERVER_Error* TRITONBACKEND_ModelBatchFinalize(void* userp) {
  CALL_LOG("BatchFinalize tally=%p", userp);
  return wrapped_ModelBatchFinalize(userp);
}
