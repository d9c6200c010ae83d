/*
 * byte_budget.c - a custom batching strategy: at most MAX_BATCH_BYTES bytes of input per batch.
 *
 * Not a backend: a small library that the dynamic batcher loads next to the model's own backend,
 * named by the model config parameter TRITON_BATCH_STRATEGY_PATH (core src/backend_model.cc:183-221
 * at r24.10). The batcher keeps all of its own rules (max_batch_size, preferred sizes, the queue
 * delay) and asks this library one more question about every queued request it considers: may it
 * join the batch being formed? A "no" ends the batch: it is sent, and that request opens the next
 * one (src/dynamic_batch_scheduler.cc:564-571).
 *
 * Why bytes: max_batch_size already caps the rows of a batch. When an input has a variable
 * dimension (dims [-1] with allow_ragged_batch), 16 rows can be 16 short requests or 16 long ones;
 * a budget in bytes caps what a batch really costs (memory, work) whatever its requests look like.
 *
 * The five functions (all or none: src/backend_model.cc:898-911), and when Triton calls them:
 *   ModelBatcherInitialize   the model loads: read MAX_BATCH_BYTES once; an error fails the load
 *   ModelBatchInitialize     a batch starts forming: a fresh tally (ours, malloc'd)
 *   ModelBatchIncludeRequest each queued request in turn: does it fit? if so, count it
 *   ModelBatchFinalize       the batch is formed: free the tally
 *   ModelBatcherFinalize     the model unloads (also after a failed BatcherInitialize): free the budget
 *
 * What the library cannot do alone in Triton 2.51: see requests already in the batch. A batch that
 * was sent without being *closed* stays open to more requests until an instance starts it, and when
 * the batcher resumes it, it hands us a fresh tally (BatchInitialize; BatchFinalize too from the
 * second resume on: :834-839) because taking requests off the queue invalidated its cursor
 * (src/dynamic_batch_scheduler.cc:343-346, 502-508, 517; src/scheduler_utils.cc:410). A batch is
 * closed when it reaches a preferred size with no queue delay (:596-599), or when we refuse a
 * request, unless the queue delay is set and a preferred size was reached earlier in that pass (then
 * :596-602 sends the batch without closing it; else :613-616 closes it). The model's config
 * therefore lists every size as preferred and sets no delay: dynamic_batching { preferred_batch_size:
 * [1, 2, ..., max] } (lab_backends.lessons.batch_strategy.every_batch_closed; notebook 09b measures
 * it, with and without, and with a delay).
 *
 * Not every BatchInitialize is followed by a BatchFinalize in Triton 2.51: the batcher finalizes a
 * batch's tally when it sends the batch (:430-436), but not the tally of the batch still forming
 * when the model unloads (its destructor, :174-182, only stops the thread), nor the last tally of a
 * batch it resumed (that batch is never sent again, :430; the next batch replaces it, :343-346).
 * Measured with the call_log wrapper (c_backends/batching/call_log): one tally per load with every
 * batch closed, one more per resumed batch. So a tally must hold nothing but memory (no lock, no
 * file, no count shared with other batches), and stay small: ours is three numbers.
 *
 * Build: lab_backends.server.cbackend.build_strategy(); `lab-backends build-backends` builds it
 * into build/batching/libbyte_budget.so.
 */
#include <ctype.h>
#include <errno.h>

#include "lab_backend_util.h"

#define STRATEGY "byte_budget"
#define PARAMETER "MAX_BATCH_BYTES"
/* A budget past 1 TiB is a typo, not a plan. */
#define MAX_BUDGET (1ull << 40)

/* The batcher: what every batch of this model shares, read-only once loaded. */
typedef struct {
  uint64_t max_bytes;
} Budget;

/* One batch being formed. IncludeRequest is not given the batcher, only this, so the tally carries
 * its own copy of the budget. */
typedef struct {
  uint64_t max_bytes;
  uint64_t bytes;    /* input bytes of the requests included so far */
  uint32_t requests; /* how many requests were included so far */
} Tally;

/* Parse "4096": digits only, > 0, at most MAX_BUDGET. */
static bool parse_budget(const char* text, uint64_t* out) {
  if (!isdigit((unsigned char)text[0])) return false; /* strtoull would accept " -1" */
  errno = 0;
  char* end = NULL;
  unsigned long long value = strtoull(text, &end, 10);
  if (errno != 0 || *end != '\0' || value == 0 || value > MAX_BUDGET) return false;
  *out = value;
  return true;
}

TRITONSERVER_Error* TRITONBACKEND_ModelBatcherInitialize(TRITONBACKEND_Batcher** batcher,
                                                         TRITONBACKEND_Model* model) {
  *batcher = NULL; /* BatcherFinalize runs even if we fail below: it must find NULL, not garbage */
  const char* name = NULL;
  LAB_RETURN_IF_ERROR(TRITONBACKEND_ModelName(model, &name));
  char* json = NULL;
  LAB_RETURN_IF_ERROR(lab_model_config_json(model, &json));
  char text[32] = "";
  bool found = false;
  TRITONSERVER_Error* err = lab_json_parameter(json, PARAMETER, text, sizeof text, &found);
  free(json);
  uint64_t max_bytes = 0;
  if (err != NULL || !found || !parse_budget(text, &max_bytes)) {
    /* Triton quotes this message as the load error: name the strategy and the fix. */
    if (err != NULL) TRITONSERVER_ErrorDelete(err);
    return lab_errorf(TRITONSERVER_ERROR_INVALID_ARG,
                      "batching strategy %s: model '%s' needs parameter %s, a whole number of bytes "
                      "from 1 to %llu; got %s%s%s. Add parameters { key: \"%s\" value { string_value: "
                      "\"4096\" } } to its config", STRATEGY, name, PARAMETER,
                      (unsigned long long)MAX_BUDGET, found ? "'" : "", found ? text : "none",
                      found ? "'" : "", PARAMETER);
  }
  Budget* budget = malloc(sizeof *budget);
  if (budget == NULL) {
    return lab_errorf(TRITONSERVER_ERROR_INTERNAL,
                      "batching strategy %s: model '%s': out of memory for its budget", STRATEGY, name);
  }
  budget->max_bytes = max_bytes;
  *batcher = (TRITONBACKEND_Batcher*)budget;
  LAB_LOG(TRITONSERVER_LOG_INFO, "batching strategy %s: model '%s': at most %llu bytes of input per batch",
          STRATEGY, name, (unsigned long long)max_bytes);
  return NULL;
}

TRITONSERVER_Error* TRITONBACKEND_ModelBatcherFinalize(TRITONBACKEND_Batcher* batcher) {
  free(batcher); /* NULL after a failed BatcherInitialize: free(NULL) does nothing */
  return NULL;
}

TRITONSERVER_Error* TRITONBACKEND_ModelBatchInitialize(const TRITONBACKEND_Batcher* batcher, void** userp) {
  *userp = NULL;
  if (batcher == NULL) {
    /* The model is unloading: Triton calls BatcherFinalize and forgets the batcher (NULL) before it
     * stops the batcher thread, which may still start a batch (core src/backend_model.cc:953-955,
     * then the scheduler at :967). No budget left to copy: let this batch form without one. */
    return NULL;
  }
  Tally* tally = malloc(sizeof *tally);
  if (tally == NULL) {
    /* Triton only logs this error (src/dynamic_batch_scheduler.cc:818-829); IncludeRequest then
     * gets NULL and lets the batch form without a budget rather than stall it. */
    return lab_errorf(TRITONSERVER_ERROR_INTERNAL, "batching strategy %s: out of memory for a batch's "
                      "tally; this batch is formed without the byte budget", STRATEGY);
  }
  tally->max_bytes = ((const Budget*)batcher)->max_bytes;
  tally->bytes = 0;
  tally->requests = 0;
  *userp = tally;
  return NULL;
}

/* The bytes of every input of a request (what its data weighs, whatever the shapes). */
static TRITONSERVER_Error* request_bytes(TRITONBACKEND_Request* request, uint64_t* total) {
  uint32_t count = 0;
  *total = 0;
  LAB_RETURN_IF_ERROR(TRITONBACKEND_RequestInputCount(request, &count));
  for (uint32_t i = 0; i < count; ++i) {
    TRITONBACKEND_Input* input = NULL;
    uint64_t bytes = 0;
    LAB_RETURN_IF_ERROR(TRITONBACKEND_RequestInputByIndex(request, i, &input));
    LAB_RETURN_IF_ERROR(TRITONBACKEND_InputProperties(input, NULL, NULL, NULL, NULL, &bytes, NULL));
    if (__builtin_add_overflow(*total, bytes, total)) *total = UINT64_MAX;
  }
  return NULL;
}

TRITONSERVER_Error* TRITONBACKEND_ModelBatchIncludeRequest(TRITONBACKEND_Request* request, void* userp,
                                                           bool* should_include) {
  Tally* tally = userp;
  /* Never refuse the first request of a batch, even one over the budget on its own: the batcher
   * would be left with an empty batch and ask again about the same request, forever (a "no"
   * ends the search with nothing pending, so nothing is sent, and the batcher thread loops straight
   * back: src/dynamic_batch_scheduler.cc:564-571, 605-609, 386-388). Set before anything can
   * fail: Triton only logs our error and then reads this flag (src/dynamic_batch_scheduler.cc:801-815). */
  *should_include = tally == NULL || tally->requests == 0;
  if (tally == NULL) return NULL; /* BatchInitialize had no budget or no memory */
  uint64_t bytes = 0;
  LAB_RETURN_IF_ERROR(request_bytes(request, &bytes));
  uint64_t after = 0;
  bool fits = !__builtin_add_overflow(tally->bytes, bytes, &after) && after <= tally->max_bytes;
  if (fits || tally->requests == 0) {
    *should_include = true;
    tally->bytes = after;
    tally->requests += 1;
  }
  return NULL;
}

TRITONSERVER_Error* TRITONBACKEND_ModelBatchFinalize(void* userp) {
  free(userp); /* the tally BatchInitialize allocated; Triton forgets the pointer after this */
  return NULL;
}
