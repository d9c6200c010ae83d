/*
 * lab_iterative.c - backend "lab_iterative": generate_iterative's character model in C, ONE
 * generation step per execution (continuous batching), served as model generate_iterative_c.
 *
 * PROMPT BYTES [1] + MAX_TOKENS INT32 [1] -> MAX_TOKENS responses, one token each, the last one
 * flagged FINAL; every response also carries the model's record of its step: STEP (the token's
 * index in its request), EXEC (this instance's execution counter), BATCH (the requests in this
 * step's forward pass) and NULLS (the null requests this execution carried, skipped). The same
 * tensors, config and records as model_repository/generate_iterative/1/model.py, so the two are
 * compared like for like (tests/test_continuous_batching_c.py, notebook 08b).
 *
 * What the iterative sequence batcher asks of a backend (config: sequence_batching {
 * iterative_sequence: true }, decoupled), one function per step below:
 *   1. admit:   skip null requests (READY 0); find or create the request's state, keyed by the
 *               correlation ID the iterative sequencer gave it; answer a bad request with an error.
 *   2. forward: one forward pass of the character model over every admitted request.
 *   3. pace:    sleep the rest of step_ms + per_sequence_ms * B (the cost model both models share).
 *   4. stream:  send each request this step's token through its response factory (FINAL on the last);
 *               a request its client cancelled gets nothing (the core answers it, see release).
 *   5. release: report statistics, then release an unfinished request with RESCHEDULE (back to the
 *               scheduler for the next step, where new requests join) and a finished one with ALL;
 *               a cancelled one with RESCHEDULE too, so that the scheduler frees its slot at once.
 *
 * The weights are build/models/charlm/charlm.npz, exported by set-up to <version>/charlm.raw:
 * a fixed 24-byte header, the vocabulary, then float32 arrays (lab_backends/charlm/raw.py says
 * why not the .npz: a zip of .npy files whose headers are Python literals, a parser we'd write).
 *
 * Arithmetic: the network is lab_backends/charlm/net.py's (embeddings of the last CONTEXT
 * characters, two ReLU layers, a score per character, greedy argmax). numpy sums in float32 in
 * its BLAS's order; here each dot product is summed in double (every float product is exact in
 * double), so the scores differ from numpy's by rounding only, ~1e-6 of their size. A token could
 * differ only where the two best scores are that close; the test measures the smallest gap on
 * its prompts before it compares the tokens.
 *
 * Build: lab_backends.server.cbackend.build("c_backends/lab_iterative/lab_iterative.c", "lab_iterative")
 * (set-up builds every c_backends/<name>/<name>.c when stale).
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>

#include "lab_backend_util.h"

#define BACKEND "lab_iterative"
#define WEIGHTS_FILE "charlm.raw"
#define MAX_CONTEXT 64
#define MAX_WIDTH 4096

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "charlm.raw holds little-endian float32, read here as native floats"
#endif

/* The trained network (lab_backends/charlm/net.py), loaded once per model. */
typedef struct {
  uint32_t context, vocab, embed, hidden;
  char chars[128];      /* vocabulary index -> character (ASCII) */
  int16_t index[128];   /* ASCII byte -> vocabulary index, -1 when not in the vocabulary */
  int32_t space;        /* the index an unknown character reads as */
  float* block;         /* every array below points into it */
  const float *emb, *w1, *b1, *w2, *b2, *w3, *b3;
} Net;

/* Per model: the network and what the config says. */
typedef struct {
  Net net;
  double step_ms, per_sequence_ms;
  int32_t max_tokens_limit;
  uint32_t slots; /* max_batch_size: the sequence slots of one instance */
} IterModel;

/* One request's generation, kept across executions (id 0: a free entry). */
typedef struct {
  uint64_t id;                 /* the correlation ID */
  int32_t ctx[MAX_CONTEXT];    /* the last CONTEXT characters as vocabulary indices */
  int32_t produced, max_tokens;
  int64_t last_exec;           /* the execution that last stepped it: evicts leftovers first */
} Sequence;

/* Per instance: the live sequences, the execution counter and scratch for the forward pass. */
typedef struct {
  IterModel* model;
  Sequence* live;
  uint32_t capacity;
  int64_t executions;
  float *x, *h1, *h2;
  double* acc;
} IterInstance;

/* What step 1 decided for one request of this execution. */
typedef enum { SKIPPED_NULL, ANSWERED, ACTIVE, CANCELLED } Kind;
typedef struct {
  Kind kind;
  TRITONBACKEND_ResponseFactory* factory;
  Sequence* seq;
  int32_t token;
  bool done, ok;
} Slot;

/* ------------------------------------------------------------------------------- backend */

/* Triton calls TRITONBACKEND_Initialize once when it loads the backend library: check that the
 * server speaks the backend API this code was written against (backend README, "Backend
 * Lifecycles" at r24.10). */
TRITONSERVER_Error* TRITONBACKEND_Initialize(TRITONBACKEND_Backend* backend) {
  (void)backend;
  return lab_check_api_version(BACKEND);
}

/* ------------------------------------------------------------------------------- model */

/* Read exactly n bytes or fail with the file's name. */
static TRITONSERVER_Error* read_exact(FILE* f, const char* path, void* dst, size_t n) {
  if (n > 0 && fread(dst, 1, n, f) != n) {
    return lab_errorf(TRITONSERVER_ERROR_INVALID_ARG, "%s: %s is truncated; run `lab-backends setup` "
                      "to write it again", BACKEND, path);
  }
  return NULL;
}

static uint32_t le32(const unsigned char* p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Check the header's sizes and the vocabulary; the caller checks the file length. */
static TRITONSERVER_Error* check_header(Net* net, const char* path, const unsigned char* header) {
  if (memcmp(header, "CHARLM\0\1", 8) != 0) {
    return lab_errorf(TRITONSERVER_ERROR_INVALID_ARG, "%s: %s is not a charlm.raw file of format 1; run "
                      "`lab-backends setup` to export the trained weights", BACKEND, path);
  }
  net->context = le32(header + 8);
  net->vocab = le32(header + 12);
  net->embed = le32(header + 16);
  net->hidden = le32(header + 20);
  if (net->context < 1 || net->context > MAX_CONTEXT || net->vocab < 1 || net->vocab > 128 ||
      net->embed < 1 || net->embed > MAX_WIDTH || net->hidden < 1 || net->hidden > MAX_WIDTH) {
    return lab_errorf(TRITONSERVER_ERROR_INVALID_ARG, "%s: %s has sizes out of range (context %u, "
                      "vocabulary %u, embedding %u, hidden %u)", BACKEND, path, net->context,
                      net->vocab, net->embed, net->hidden);
  }
  return NULL;
}

/* Map characters to indices; every character must be ASCII and appear once, the space included. */
static TRITONSERVER_Error* index_vocabulary(Net* net, const char* path) {
  for (int c = 0; c < 128; ++c) net->index[c] = -1;
  for (uint32_t i = 0; i < net->vocab; ++i) {
    unsigned char c = (unsigned char)net->chars[i];
    if (c >= 128 || net->index[c] != -1) {
      return lab_errorf(TRITONSERVER_ERROR_INVALID_ARG, "%s: %s: vocabulary byte %u is not ASCII or "
                        "repeats", BACKEND, path, c);
    }
    net->index[c] = (int16_t)i;
  }
  net->space = net->index[' '];
  if (net->space < 0) {
    return lab_errorf(TRITONSERVER_ERROR_INVALID_ARG, "%s: %s: the vocabulary has no space", BACKEND, path);
  }
  return NULL;
}

/* Load <version folder>/charlm.raw (layout: lab_backends/charlm/raw.py). The size must match the
 * header to the byte: a stale or foreign file fails the load instead of generating nonsense. */
static TRITONSERVER_Error* load_net(Net* net, const char* path) {
  FILE* f = fopen(path, "rb");
  if (f == NULL) {
    return lab_errorf(TRITONSERVER_ERROR_NOT_FOUND, "%s: cannot open %s (%s); `lab-backends setup` "
                      "exports it from the trained character model", BACKEND, path, strerror(errno));
  }
  unsigned char header[24];
  TRITONSERVER_Error* err = read_exact(f, path, header, sizeof header);
  if (err == NULL) err = check_header(net, path, header);
  uint64_t c = net->context, v = net->vocab, e = net->embed, h = net->hidden;
  uint64_t floats = v * e + c * e * h + h + h * h + h + h * v + v;
  uint64_t vocab_bytes = (v + 3) / 4 * 4;
  if (err == NULL && (fseek(f, 0, SEEK_END) != 0 || (uint64_t)ftell(f) != 24 + vocab_bytes + 4 * floats)) {
    err = lab_errorf(TRITONSERVER_ERROR_INVALID_ARG, "%s: %s should hold %llu bytes for its header's "
                     "sizes; run `lab-backends setup` to export it again", BACKEND, path,
                     (unsigned long long)(24 + vocab_bytes + 4 * floats));
  }
  if (err == NULL && fseek(f, 24, SEEK_SET) != 0) {
    err = lab_errorf(TRITONSERVER_ERROR_INTERNAL, "%s: cannot seek in %s", BACKEND, path);
  }
  char padded[128 + 4];
  if (err == NULL) err = read_exact(f, path, padded, vocab_bytes);
  if (err == NULL) {
    memcpy(net->chars, padded, v);
    err = index_vocabulary(net, path);
  }
  if (err == NULL && (net->block = malloc(4 * floats)) == NULL) {
    err = lab_errorf(TRITONSERVER_ERROR_INTERNAL, "%s: out of memory for the weights", BACKEND);
  }
  if (err == NULL) err = read_exact(f, path, net->block, 4 * floats);
  fclose(f);
  if (err != NULL) return err;
  net->emb = net->block;          /* [V, E] */
  net->w1 = net->emb + v * e;     /* [CONTEXT*E, H] */
  net->b1 = net->w1 + c * e * h;  /* [H] */
  net->w2 = net->b1 + h;          /* [H, H] */
  net->b2 = net->w2 + h * h;      /* [H] */
  net->w3 = net->b2 + h;          /* [H, V] */
  net->b3 = net->w3 + h * v;      /* [V] */
  return NULL;
}

/* A config parameter as a number >= low, or its default when absent. */
static TRITONSERVER_Error* number_parameter(const char* json, const char* key, double fallback, double low,
                                            double* out) {
  char text[64];
  bool found = false;
  LAB_RETURN_IF_ERROR(lab_json_parameter(json, key, text, sizeof text, &found));
  *out = fallback;
  if (!found) return NULL;
  errno = 0;
  char* end = NULL;
  *out = strtod(text, &end);
  if (errno != 0 || end == text || *end != '\0' || !isfinite(*out) || *out < low) {
    return lab_errorf(TRITONSERVER_ERROR_INVALID_ARG, "%s: parameter '%s' must be a number >= %g, got "
                      "'%s'", BACKEND, key, low, text);
  }
  return NULL;
}

/* The config must be what this backend's releases need: RESCHEDULE is refused unless the
 * iterative sequencer handles it (core src/infer_request.cc:113-125 at r24.10), and a request
 * that gets many responses needs a decoupled model. And a READY control input: `direct` fills an
 * empty slot below a busy one with a null request whether or not the config has one (core
 * src/sequence_batch_scheduler/sequence_batch_scheduler.cc:1745-1767), its other inputs are
 * garbage, and READY 0 is the only mark it carries (the core does not require the control: it is
 * looked up with required=false, 638-644). Say so at load, not at the first request. The config
 * JSON is compact (no spaces), and READY is the only tensor of that name here. */
static TRITONSERVER_Error* check_config(const char* json, const char* name) {
  if (strstr(json, "\"iterative_sequence\":true") == NULL || strstr(json, "\"decoupled\":true") == NULL) {
    return lab_errorf(TRITONSERVER_ERROR_INVALID_ARG, "%s: model '%s' needs sequence_batching { "
                      "iterative_sequence: true } and model_transaction_policy { decoupled: true } in "
                      "config.pbtxt: it releases unfinished requests with RESCHEDULE and streams one "
                      "response per token", BACKEND, name);
  }
  if (strstr(json, "\"CONTROL_SEQUENCE_READY\"") == NULL || strstr(json, "\"name\":\"READY\"") == NULL) {
    return lab_errorf(TRITONSERVER_ERROR_INVALID_ARG, "%s: model '%s' needs a control input named READY in "
                      "sequence_batching: control_input [ { name: \"READY\" control [ { kind: "
                      "CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] } ] in config.pbtxt: the "
                      "scheduler fills empty slots with null requests, and READY 0 is how they are told apart",
                      BACKEND, name);
  }
  return NULL;
}

static TRITONSERVER_Error* read_config(IterModel* state, TRITONBACKEND_Model* model, const char* name) {
  char* json = NULL;
  LAB_RETURN_IF_ERROR(lab_model_config_json(model, &json));
  double limit = 0;
  TRITONSERVER_Error* err = check_config(json, name);
  if (err == NULL) err = number_parameter(json, "step_ms", 6, 0, &state->step_ms);
  if (err == NULL) err = number_parameter(json, "per_sequence_ms", 0.5, 0, &state->per_sequence_ms);
  if (err == NULL) err = number_parameter(json, "max_tokens_limit", 256, 1, &limit);
  /* Slots per instance: max_batch_size, or oldest's max_candidate_sequences (sequence_batch_scheduler.cc
   * 163-171 at r24.10). Bounded: the table of live sequences is sized from it. */
  long long slots = lab_json_int(json, "max_batch_size");
  long long candidates = lab_json_int(json, "max_candidate_sequences");
  free(json);
  if (err != NULL) return err;
  slots = candidates > slots ? candidates : slots;
  state->max_tokens_limit = limit > INT32_MAX ? INT32_MAX : (int32_t)limit;
  state->slots = slots < 1 ? 1 : slots > 65536 ? 65536 : (uint32_t)slots;
  return NULL;
}

/* Triton calls TRITONBACKEND_ModelInitialize once per model version it loads; an error fails the
 * load with our message. The model's files are under TRITONBACKEND_ModelRepository (core
 * include/triton/core/tritonbackend.h:1016-1031 at r24.10): the weights are <version>/charlm.raw. */
TRITONSERVER_Error* TRITONBACKEND_ModelInitialize(TRITONBACKEND_Model* model) {
  const char* name = NULL;
  uint64_t version = 0;
  const char* location = NULL;
  TRITONBACKEND_ArtifactType kind = TRITONBACKEND_ARTIFACT_FILESYSTEM;
  LAB_RETURN_IF_ERROR(TRITONBACKEND_ModelName(model, &name));
  LAB_RETURN_IF_ERROR(TRITONBACKEND_ModelVersion(model, &version));
  LAB_RETURN_IF_ERROR(TRITONBACKEND_ModelRepository(model, &kind, &location));
  IterModel* state = calloc(1, sizeof *state);
  if (state == NULL) return lab_errorf(TRITONSERVER_ERROR_INTERNAL, "%s: out of memory", BACKEND);
  char path[4096];
  snprintf(path, sizeof path, "%s/%llu/%s", location, (unsigned long long)version, WEIGHTS_FILE);
  TRITONSERVER_Error* err = read_config(state, model, name);
  if (err == NULL) err = load_net(&state->net, path);
  if (err == NULL) err = TRITONBACKEND_ModelSetState(model, state);
  if (err != NULL) {
    free(state->net.block);
    free(state);
    return err;
  }
  LAB_LOG(TRITONSERVER_LOG_INFO, "%s: model '%s' version %llu: %s (vocabulary %u, context %u, hidden %u), "
          "a step costs %g ms + %g ms per sequence", BACKEND, name, (unsigned long long)version, path,
          state->net.vocab, state->net.context, state->net.hidden, state->step_ms, state->per_sequence_ms);
  return NULL;
}

/* Triton calls TRITONBACKEND_ModelFinalize after every instance of the model is finalized, and
 * after a failed load too (core src/backend_model.cc:169-176, 983-987 at r24.10): the state is
 * NULL then if ModelInitialize failed, since it sets the state last. */
TRITONSERVER_Error* TRITONBACKEND_ModelFinalize(TRITONBACKEND_Model* model) {
  void* state = NULL;
  LAB_RETURN_IF_ERROR(TRITONBACKEND_ModelState(model, &state));
  if (state != NULL) free(((IterModel*)state)->net.block);
  free(state);
  return NULL;
}

/* ------------------------------------------------------------------------------- instance */

static void free_instance(IterInstance* state) {
  if (state == NULL) return;
  free(state->live);
  free(state->x);
  free(state->h1);
  free(state->h2);
  free(state->acc);
  free(state);
}

/* Triton calls TRITONBACKEND_ModelInstanceInitialize once per instance. Each instance has its own
 * sequence batcher and slots (core src/sequence_batch_scheduler/sequence_batch_scheduler.cc
 * 160-174 at r24.10), so a sequence always comes back to the same instance: its state lives here.
 * The table holds every slot's sequence with room to spare; a leftover (a request the server
 * dropped while it was queued) is evicted when the table is full, oldest first. */
TRITONSERVER_Error* TRITONBACKEND_ModelInstanceInitialize(TRITONBACKEND_ModelInstance* instance) {
  TRITONBACKEND_Model* model = NULL;
  void* model_state = NULL;
  LAB_RETURN_IF_ERROR(TRITONBACKEND_ModelInstanceModel(instance, &model));
  LAB_RETURN_IF_ERROR(TRITONBACKEND_ModelState(model, &model_state));
  IterInstance* state = calloc(1, sizeof *state);
  if (state == NULL) return lab_errorf(TRITONSERVER_ERROR_INTERNAL, "%s: out of memory", BACKEND);
  state->model = model_state;
  const Net* net = &state->model->net;
  uint32_t widest = net->hidden > net->vocab ? net->hidden : net->vocab;
  state->capacity = 4 * state->model->slots + 16;
  state->live = calloc(state->capacity, sizeof *state->live);
  state->x = malloc((size_t)net->context * net->embed * sizeof(float));
  state->h1 = malloc(net->hidden * sizeof(float));
  state->h2 = malloc(net->hidden * sizeof(float));
  state->acc = malloc(widest * sizeof(double));
  TRITONSERVER_Error* err = NULL;
  if (!state->live || !state->x || !state->h1 || !state->h2 || !state->acc) {
    err = lab_errorf(TRITONSERVER_ERROR_INTERNAL, "%s: out of memory", BACKEND);
  }
  if (err == NULL) err = TRITONBACKEND_ModelInstanceSetState(instance, state);
  if (err != NULL) free_instance(state);
  return err;
}

/* Triton calls TRITONBACKEND_ModelInstanceFinalize at unload, after the instance's last Execute,
 * and after a failed ModelInstanceInitialize, with the state NULL (set last; core
 * src/backend_model_instance.cc:209-214, 305-311). free_instance(NULL) does nothing. */
TRITONSERVER_Error* TRITONBACKEND_ModelInstanceFinalize(TRITONBACKEND_ModelInstance* instance) {
  void* state = NULL;
  LAB_RETURN_IF_ERROR(TRITONBACKEND_ModelInstanceState(instance, &state));
  free_instance(state);
  return NULL;
}

/* ------------------------------------------------------------------------------- step 1: admit */

/* The entry of sequence 'id', or NULL. */
static Sequence* find_sequence(IterInstance* state, uint64_t id) {
  for (uint32_t i = 0; i < state->capacity; ++i) {
    if (state->live[i].id == id) return &state->live[i];
  }
  return NULL;
}

/* A free entry for a new sequence; when none is free, the one stepped longest ago. */
static Sequence* new_sequence(IterInstance* state, uint64_t id) {
  Sequence* pick = find_sequence(state, 0);
  if (pick == NULL) {
    pick = &state->live[0];
    for (uint32_t i = 1; i < state->capacity; ++i) {
      if (state->live[i].last_exec < pick->last_exec) pick = &state->live[i];
    }
    LAB_LOG(TRITONSERVER_LOG_WARN, "%s: %u sequences live: forgetting sequence %llu, last stepped in "
            "execution %lld", BACKEND, state->capacity, (unsigned long long)pick->id, (long long)pick->last_exec);
  }
  memset(pick, 0, sizeof *pick);
  pick->id = id;
  pick->last_exec = state->executions;
  return pick;
}

/* The length of the UTF-8 character starting at s[0] (n bytes left), 0 when the bytes are not
 * well-formed UTF-8 (Unicode 15, table 3-7: no overlong forms, no surrogates, at most U+10FFFF). */
static size_t utf8_length(const unsigned char* s, size_t n) {
  unsigned char b = s[0];
  size_t len = b < 0x80 ? 1 : b >= 0xC2 && b <= 0xDF ? 2 : b >= 0xE0 && b <= 0xEF ? 3 : b >= 0xF0 && b <= 0xF4 ? 4 : 0;
  if (len == 0 || len > n) return 0;
  unsigned char lo = 0x80, hi = 0xBF; /* the second byte's range */
  if (b == 0xE0) lo = 0xA0;
  if (b == 0xED) hi = 0x9F;
  if (b == 0xF0) lo = 0x90;
  if (b == 0xF4) hi = 0x8F;
  if (len > 1 && (s[1] < lo || s[1] > hi)) return 0;
  for (size_t k = 2; k < len; ++k) {
    if (s[k] < 0x80 || s[k] > 0xBF) return 0;
  }
  return len;
}

/* The prompt's last CONTEXT characters (code points, as Python counts them) as vocabulary indices,
 * left-padded with spaces; a character outside the vocabulary reads as a space (net.py context_ids).
 * generate_iterative decodes a malformed prompt with replacement characters; here it is refused. */
static TRITONSERVER_Error* prompt_context(const Net* net, const unsigned char* text, size_t n, int32_t* ctx) {
  int32_t ring[MAX_CONTEXT];
  uint64_t count = 0;
  for (size_t at = 0; at < n;) {
    size_t len = utf8_length(text + at, n - at);
    if (len == 0) {
      return lab_errorf(TRITONSERVER_ERROR_INVALID_ARG, "%s: PROMPT is not valid UTF-8 (byte %zu); "
                        "send UTF-8 text", BACKEND, at);
    }
    int32_t id = len == 1 && net->index[text[at]] >= 0 ? net->index[text[at]] : net->space;
    ring[count++ % net->context] = id;
    at += len;
  }
  for (uint32_t j = 0; j < net->context; ++j) {
    uint64_t from_end = net->context - j; /* ctx[context-1] is the last character */
    ctx[j] = from_end > count ? net->space : ring[(count - from_end) % net->context];
  }
  return NULL;
}

/* PROMPT: one BYTES element, i.e. a 4-byte little-endian length then the bytes (Triton's
 * serialization of a BYTES tensor, which may arrive split over several buffers). */
static TRITONSERVER_Error* read_prompt(TRITONBACKEND_Request* request, const Net* net, int32_t* ctx) {
  LabInput info;
  TRITONSERVER_Error* err = TRITONBACKEND_RequestInput(request, "PROMPT", &info.input);
  if (err != NULL) {
    TRITONSERVER_ErrorDelete(err);
    return lab_errorf(TRITONSERVER_ERROR_INVALID_ARG, "%s: the request has no input 'PROMPT'", BACKEND);
  }
  TRITONSERVER_DataType dtype = TRITONSERVER_TYPE_INVALID;
  LAB_RETURN_IF_ERROR(TRITONBACKEND_InputProperties(info.input, NULL, &dtype, &info.shape, &info.dims,
                                                    &info.byte_size, &info.buffers));
  uint64_t elements = 1;
  for (uint32_t d = 0; d < info.dims; ++d) elements = info.shape[d] == 1 ? elements : 0;
  if (dtype != TRITONSERVER_TYPE_BYTES || elements != 1 || info.byte_size < 4) {
    return lab_errorf(TRITONSERVER_ERROR_INVALID_ARG, "%s: PROMPT must be one string (BYTES, shape [1])",
                      BACKEND);
  }
  unsigned char* block = malloc(info.byte_size);
  if (block == NULL) return lab_errorf(TRITONSERVER_ERROR_INTERNAL, "%s: out of memory", BACKEND);
  err = lab_gather_input(BACKEND, &info, block);
  if (err == NULL && 4 + (uint64_t)le32(block) != info.byte_size) {
    err = lab_errorf(TRITONSERVER_ERROR_INVALID_ARG, "%s: PROMPT's length prefix says %u bytes, it holds "
                     "%llu", BACKEND, le32(block), (unsigned long long)(info.byte_size - 4));
  }
  if (err == NULL) err = prompt_context(net, block + 4, info.byte_size - 4, ctx);
  free(block);
  return err;
}

/* One INT32 element of input 'name' (MAX_TOKENS, READY). */
static TRITONSERVER_Error* read_int32(TRITONBACKEND_Request* request, const char* name, int32_t* value) {
  LabInput info;
  LAB_RETURN_IF_ERROR(lab_get_input(BACKEND, request, name, TRITONSERVER_TYPE_INT32, &info));
  if (info.elements != 1) {
    return lab_errorf(TRITONSERVER_ERROR_INVALID_ARG, "%s: %s must hold one INT32", BACKEND, name);
  }
  return lab_gather_input(BACKEND, &info, value);
}

/* A null request fills an empty slot below a busy one; its READY control is 0 and its other
 * inputs mean nothing (core src/sequence_batch_scheduler/sequence_batch_scheduler.cc:1734-1768
 * at r24.10). check_config made READY part of the config, so the core sets it on every request,
 * real (1789) or null (1766-1767); one without it would be a core defect: treated as null, it
 * is released with nothing computed or answered. */
static bool is_null_request(TRITONBACKEND_Request* request) {
  int32_t ready = 0;
  TRITONSERVER_Error* err = read_int32(request, "READY", &ready);
  if (err != NULL) {
    LAB_LOG(TRITONSERVER_LOG_ERROR, "%s: a request without READY, skipped: %s", BACKEND, TRITONSERVER_ErrorMessage(err));
    TRITONSERVER_ErrorDelete(err);
  }
  return err != NULL || ready == 0;
}

/* Start a sequence: its prompt's context and its length, checked. */
static TRITONSERVER_Error* start_sequence(const IterModel* model, TRITONBACKEND_Request* request, Sequence* seq) {
  LAB_RETURN_IF_ERROR(read_int32(request, "MAX_TOKENS", &seq->max_tokens));
  if (seq->max_tokens < 1 || seq->max_tokens > model->max_tokens_limit) {
    return lab_errorf(TRITONSERVER_ERROR_INVALID_ARG, "MAX_TOKENS must be between 1 and %d, got %d",
                      model->max_tokens_limit, seq->max_tokens);
  }
  return read_prompt(request, &model->net, seq->ctx);
}

/* The state of this request's sequence. The iterative sequencer gives a request without a
 * correlation ID its own and the SEQUENCE_START flag, and clears the flags when it comes back
 * rescheduled (core src/sequence_batch_scheduler/sequence_utils.h:78-90, sequence_utils.cc:35-38
 * at r24.10): START, or an ID we do not know, begins a generation; otherwise it continues. */
static TRITONSERVER_Error* find_state(IterInstance* state, TRITONBACKEND_Request* request, Sequence** seq) {
  uint64_t id = 0;
  uint32_t flags = 0;
  TRITONSERVER_Error* err = TRITONBACKEND_RequestCorrelationId(request, &id);
  if (err != NULL || id == 0) {
    if (err != NULL) TRITONSERVER_ErrorDelete(err);
    return lab_errorf(TRITONSERVER_ERROR_INVALID_ARG, "%s: a generation is keyed by an integer correlation "
                      "ID: send none (the iterative sequencer assigns one) or an unsigned integer", BACKEND);
  }
  LAB_RETURN_IF_ERROR(TRITONBACKEND_RequestFlags(request, &flags));
  *seq = find_sequence(state, id);
  if (*seq != NULL && !(flags & TRITONSERVER_REQUEST_FLAG_SEQUENCE_START)) return NULL;
  if (*seq != NULL) (*seq)->id = 0; /* a client's ID used again: that sequence starts over */
  *seq = new_sequence(state, id);
  err = start_sequence(state->model, request, *seq);
  if (err != NULL) {
    (*seq)->id = 0; /* refused: nothing to remember */
    *seq = NULL;
  }
  return err;
}

/* Step 0: sort out the null requests, and make a response factory for every real one (a decoupled
 * model answers through one: backend README "Decoupled Responses" at r24.10), all before anything
 * else. If one cannot be made, none is kept and Execute returns the error: Triton still owns the
 * requests then and answers each with it (backend examples/backends/recommended/src/
 * recommended.cc L509-515 at r24.10). Made later, a failed one would leave its request released
 * with no response, and its client's stream open for good. */
static TRITONSERVER_Error* new_factories(TRITONBACKEND_Request** requests, uint32_t count, Slot* slots) {
  for (uint32_t i = 0; i < count; ++i) {
    if (is_null_request(requests[i])) {
      slots[i].kind = SKIPPED_NULL; /* nobody waits for it: no response, released with ALL below */
      continue;
    }
    slots[i].kind = ANSWERED;
    TRITONSERVER_Error* err = TRITONBACKEND_ResponseFactoryNew(&slots[i].factory, requests[i]);
    if (err == NULL) continue;
    for (uint32_t j = 0; j < i; ++j) {
      if (slots[j].factory == NULL) continue;
      TRITONSERVER_Error* del = TRITONBACKEND_ResponseFactoryDelete(slots[j].factory);
      if (del != NULL) TRITONSERVER_ErrorDelete(del);
      slots[j].factory = NULL;
    }
    return err;
  }
  return NULL;
}

/* Step 1 for one real request (its factory made in step 0): its sequence's state; a refused request
 * gets its error and its one FINAL flag. */
static void admit(IterInstance* state, TRITONBACKEND_Request* request, Slot* slot) {
  TRITONSERVER_Error* err = find_state(state, request, &slot->seq);
  if (err != NULL) {
    TRITONBACKEND_Response* response = NULL;
    TRITONSERVER_Error* new_err = TRITONBACKEND_ResponseNewFromFactory(&response, slot->factory);
    if (new_err == NULL) {
      lab_send_error(response, err); /* FINAL, with the error */
      return;
    }
    TRITONSERVER_ErrorDelete(new_err);
    TRITONSERVER_ErrorDelete(err);
    new_err = TRITONBACKEND_ResponseFactorySendFlags(slot->factory, TRITONSERVER_RESPONSE_COMPLETE_FINAL);
    if (new_err != NULL) TRITONSERVER_ErrorDelete(new_err);
    return;
  }
  slot->kind = ACTIVE;
}

/* ------------------------------------------------------------------------------- step 2: forward */

/* out[j] = relu?(b[j] + sum_k in[k] * w[k*cols + j]), w row-major [rows, cols], summed in double. */
static void dense(const float* in, uint32_t rows, const float* w, const float* b, uint32_t cols, bool relu,
                  double* acc, float* out) {
  for (uint32_t j = 0; j < cols; ++j) acc[j] = 0.0;
  for (uint32_t k = 0; k < rows; ++k) {
    const double xk = in[k];
    const float* row = w + (size_t)k * cols;
    for (uint32_t j = 0; j < cols; ++j) acc[j] += xk * row[j];
  }
  for (uint32_t j = 0; j < cols; ++j) {
    double v = acc[j] + b[j];
    if (out != NULL) out[j] = (float)(relu && v < 0 ? 0 : v);
    else acc[j] = v;
  }
}

/* The next character of one context: embeddings -> ReLU -> ReLU -> scores, greedy (the first of
 * equal best scores, as numpy.argmax). */
static int32_t next_token(IterInstance* state, const int32_t* ctx) {
  const Net* net = &state->model->net;
  for (uint32_t p = 0; p < net->context; ++p) {
    memcpy(state->x + (size_t)p * net->embed, net->emb + (size_t)ctx[p] * net->embed, net->embed * sizeof(float));
  }
  dense(state->x, net->context * net->embed, net->w1, net->b1, net->hidden, true, state->acc, state->h1);
  dense(state->h1, net->hidden, net->w2, net->b2, net->hidden, true, state->acc, state->h2);
  dense(state->h2, net->hidden, net->w3, net->b3, net->vocab, false, state->acc, NULL);
  int32_t best = 0;
  for (uint32_t j = 1; j < net->vocab; ++j) best = state->acc[j] > state->acc[best] ? (int32_t)j : best;
  return best;
}

/* Step 2: ONE forward pass over every admitted request (one step each); returns B, their number. */
static uint32_t forward(IterInstance* state, Slot* slots, uint32_t count) {
  uint32_t batch = 0;
  for (uint32_t i = 0; i < count; ++i) {
    if (slots[i].kind != ACTIVE) continue;
    slots[i].token = next_token(state, slots[i].seq->ctx);
    ++batch;
  }
  return batch;
}

/* ------------------------------------------------------------------------------- step 3: pace */

/* Step 3: a real LLM's step costs milliseconds (reading its weights once per step, plus a little
 * per sequence); this network costs microseconds. Sleep until step_ms + per_sequence_ms * B after
 * the pass began, generate_iterative's cost model, so the two backends differ only in language. */
static void pace(const IterModel* model, uint64_t compute_start, uint32_t batch) {
  double cost_ns = (model->step_ms + model->per_sequence_ms * batch) * 1e6;
  uint64_t deadline = compute_start + (uint64_t)cost_ns;
  struct timespec until = {(time_t)(deadline / 1000000000ull), (long)(deadline % 1000000000ull)};
  while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &until, NULL) == EINTR) {
  }
}

/* ------------------------------------------------------------------------------- step 4: stream */

/* Did the client cancel this request (it went away, or its deadline passed)? Asked after the step's
 * compute: a request spends nearly all its time inside a step, so that is where a cancel lands; one
 * that lands while it waits in its slot is found by the batcher itself (see release). A cancelled
 * request is forgotten and gets no token: release hands it back, and the core answers it. */
static bool cancelled_now(Slot* slot, TRITONBACKEND_Request* request) {
  bool cancelled = false;
  TRITONSERVER_Error* err = TRITONBACKEND_RequestIsCancelled(request, &cancelled);
  if (err != NULL) TRITONSERVER_ErrorDelete(err);
  if (!cancelled) return false;
  slot->seq->id = 0;
  slot->seq = NULL;
  slot->kind = CANCELLED;
  return true;
}

/* Whether the client asked for output 'name' (all outputs when it named none). */
static bool requested(TRITONBACKEND_Request* request, const char* name) {
  uint32_t count = 0;
  TRITONSERVER_Error* err = TRITONBACKEND_RequestOutputCount(request, &count);
  if (err != NULL) {
    TRITONSERVER_ErrorDelete(err);
    return true;
  }
  for (uint32_t i = 0; i < count; ++i) {
    const char* asked = NULL;
    err = TRITONBACKEND_RequestOutputName(request, i, &asked);
    if (err != NULL) TRITONSERVER_ErrorDelete(err);
    else if (strcmp(asked, name) == 0) return true;
  }
  return false;
}

/* One output of shape [1, 1] (the batch dimension, then one element) holding 'bytes' bytes. */
static TRITONSERVER_Error* add_output(TRITONBACKEND_Request* request, TRITONBACKEND_Response* response,
                                      const char* name, TRITONSERVER_DataType dtype, const void* data,
                                      uint64_t bytes) {
  if (!requested(request, name)) return NULL;
  static const int64_t shape[2] = {1, 1};
  TRITONBACKEND_Output* output = NULL;
  void* buffer = NULL;
  TRITONSERVER_MemoryType mem = TRITONSERVER_MEMORY_CPU;
  int64_t mem_id = 0;
  LAB_RETURN_IF_ERROR(TRITONBACKEND_ResponseOutput(response, &output, name, dtype, shape, 2));
  LAB_RETURN_IF_ERROR(TRITONBACKEND_OutputBuffer(output, &buffer, bytes, &mem, &mem_id));
  if (mem == TRITONSERVER_MEMORY_GPU) {
    return lab_errorf(TRITONSERVER_ERROR_UNSUPPORTED, "%s: output buffer in GPU memory", BACKEND);
  }
  memcpy(buffer, data, bytes);
  return NULL;
}

/* Every output and its buffer, created before the response is sent (tritonbackend.h:652-660 at
 * r24.10: all of one response's outputs before the next response of the same request). */
static TRITONSERVER_Error* fill_outputs(TRITONBACKEND_Request* request, TRITONBACKEND_Response* response,
                                        char character, int32_t step, int64_t execution, int32_t batch,
                                        int32_t nulls) {
  unsigned char text[5] = {1, 0, 0, 0, (unsigned char)character}; /* BYTES: 4-byte length, then the byte */
  LAB_RETURN_IF_ERROR(add_output(request, response, "TEXT", TRITONSERVER_TYPE_BYTES, text, sizeof text));
  LAB_RETURN_IF_ERROR(add_output(request, response, "STEP", TRITONSERVER_TYPE_INT32, &step, sizeof step));
  LAB_RETURN_IF_ERROR(add_output(request, response, "EXEC", TRITONSERVER_TYPE_INT64, &execution, sizeof execution));
  LAB_RETURN_IF_ERROR(add_output(request, response, "BATCH", TRITONSERVER_TYPE_INT32, &batch, sizeof batch));
  return add_output(request, response, "NULLS", TRITONSERVER_TYPE_INT32, &nulls, sizeof nulls);
}

/* Step 4 for one request: advance its sequence by the token and send the token; the last one
 * carries FINAL, the one flag that ends the client's stream. */
static TRITONSERVER_Error* stream_token(IterInstance* state, TRITONBACKEND_Request* request, Slot* slot,
                                        int32_t batch, int32_t nulls) {
  const Net* net = &state->model->net;
  Sequence* seq = slot->seq;
  int32_t step = seq->produced++;
  memmove(seq->ctx, seq->ctx + 1, (net->context - 1) * sizeof(int32_t));
  seq->ctx[net->context - 1] = slot->token;
  seq->last_exec = state->executions;
  slot->done = seq->produced >= seq->max_tokens;
  TRITONBACKEND_Response* response = NULL;
  LAB_RETURN_IF_ERROR(TRITONBACKEND_ResponseNewFromFactory(&response, slot->factory));
  TRITONSERVER_Error* err = fill_outputs(request, response, net->chars[slot->token], step, state->executions,
                                         batch, nulls);
  if (err != NULL) { /* not sent yet, so still ours to delete */
    TRITONSERVER_Error* del = TRITONBACKEND_ResponseDelete(response);
    if (del != NULL) TRITONSERVER_ErrorDelete(del);
    return err;
  }
  /* Triton takes the response whatever ResponseSend returns: never touch it again
   * (tritonbackend.h:757-759 at r24.10; see scale.c). */
  return TRITONBACKEND_ResponseSend(response, slot->done ? TRITONSERVER_RESPONSE_COMPLETE_FINAL : 0, NULL);
}

/* ------------------------------------------------------------------------------- step 5: release */

/* End a request's stream and the request: the FINAL flag if it was not sent with a token, then
 * RELEASE_ALL; the iterative sequencer then enqueues a null END request for its correlation ID,
 * which frees its slot (sequence_utils.cc:40-56), unless the request was cancelled (43). */
static void end_request(TRITONBACKEND_Request* request, Slot* slot) {
  TRITONSERVER_Error* err = NULL;
  if (slot->kind == ACTIVE && slot->seq != NULL) slot->seq->id = 0; /* finished or failed: forget it */
  if ((slot->kind == ACTIVE && !(slot->ok && slot->done)) || slot->kind == CANCELLED) { /* needs its FINAL */
    err = TRITONBACKEND_ResponseFactorySendFlags(slot->factory, TRITONSERVER_RESPONSE_COMPLETE_FINAL);
    if (err != NULL) TRITONSERVER_ErrorDelete(err);
  }
  err = TRITONBACKEND_RequestRelease(request, TRITONSERVER_REQUEST_RELEASE_ALL);
  if (err != NULL) {
    LAB_LOG(TRITONSERVER_LOG_ERROR, "%s: cannot release: %s", BACKEND, TRITONSERVER_ErrorMessage(err));
    TRITONSERVER_ErrorDelete(err);
  }
}

/* Step 5 for one request: statistics first (they need a request we still own: tritonbackend.h
 * 1336-1340 at r24.10), then the release. RESCHEDULE puts an unfinished request back in its
 * sequence slot's queue, inputs and all, for the next step (core src/sequence_batch_scheduler/
 * sequence_utils.cc:35-38); a finished, refused or null one ends with ALL.
 * A cancelled request is rescheduled too, with nothing sent: released with ALL it would end
 * nothing (sequence_utils.cc:43 skips the END request of a cancelled one) and its slot would wait
 * for the idle reaper (max_sequence_idle_microseconds: 5 s here). Back at the head of its slot's
 * queue, the batcher finds it cancelled and frees the slot before it forms the next step
 * (sequence_batch_scheduler.cc:1644-1656), then answers it CANCELLED, FINAL (84-97).
 * A failed RESCHEDULE leaves the request ours (src/backend_model.cc:1346-1360): end it instead. */
static void release(TRITONBACKEND_ModelInstance* instance, TRITONBACKEND_Request* request, Slot* slot,
                    const uint64_t stamps[4]) {
  /* Reported at every step, as python_backend does for every request of every execution
   * (src/pb_metric_reporter.cc L44-67 at r24.10): core counts one success per step, i.e. per token
   * (infer_request.cc:1445-1449), and since a rescheduled request keeps its original start
   * (server.cc:545 captures it once), each step's request duration runs from the request's start:
   * their sum grows with the square of the length. Notebook 08b reads these statistics. */
  /* No report for a null request (core ignores its statistics: infer_request.cc:520, 1429), nor for a
   * cancelled one: the core counts its failure when it answers it CANCELLED (infer_request.cc:1410-1421
   * via sequence_batch_scheduler.cc:84-97); a report here would count it twice. */
  if (slot->kind != SKIPPED_NULL && slot->kind != CANCELLED) {
    TRITONSERVER_Error* err = TRITONBACKEND_ModelInstanceReportStatistics(
        instance, request, slot->kind == ACTIVE && slot->ok, stamps[0], stamps[1], stamps[2], stamps[3]);
    if (err != NULL) TRITONSERVER_ErrorDelete(err);
  }
  TRITONSERVER_Error* err = NULL;
  bool reschedule = (slot->kind == ACTIVE && slot->ok && !slot->done) || slot->kind == CANCELLED;
  if (reschedule) {
    err = TRITONBACKEND_RequestRelease(request, TRITONSERVER_REQUEST_RELEASE_RESCHEDULE);
    if (err != NULL) {
      LAB_LOG(TRITONSERVER_LOG_ERROR, "%s: cannot reschedule: %s", BACKEND, TRITONSERVER_ErrorMessage(err));
      TRITONSERVER_ErrorDelete(err);
      slot->ok = false;
      reschedule = false;
    }
  }
  if (!reschedule) end_request(request, slot);
  if (slot->factory != NULL) { /* our handle only: the request's own factory lives on */
    err = TRITONBACKEND_ResponseFactoryDelete(slot->factory);
    if (err != NULL) TRITONSERVER_ErrorDelete(err);
  }
}

/* ------------------------------------------------------------------------------- execute */

/* Triton calls TRITONBACKEND_ModelInstanceExecute with the requests of one step: every sequence
 * slot's request (or a null one), formed only after the previous step's execution returned, when
 * every rescheduled request is back in its slot (core src/sequence_batch_scheduler/
 * sequence_batch_scheduler.cc:1583-1588, 1856-1866 at r24.10). Returning an error would hand the
 * requests back to Triton; past the first check, every request is answered and released here. */
TRITONSERVER_Error* TRITONBACKEND_ModelInstanceExecute(
    TRITONBACKEND_ModelInstance* instance, TRITONBACKEND_Request** requests, uint32_t count) {
  uint64_t stamps[4] = {lab_now_ns(), 0, 0, 0}; /* exec start, compute start, compute end, exec end */
  IterInstance* state = NULL;
  LAB_RETURN_IF_ERROR(TRITONBACKEND_ModelInstanceState(instance, (void**)&state));
  Slot* slots = calloc(count ? count : 1, sizeof *slots);
  if (slots == NULL) return lab_errorf(TRITONSERVER_ERROR_INTERNAL, "%s: out of memory", BACKEND);
  TRITONSERVER_Error* no_factory = new_factories(requests, count, slots); /* step 0 */
  if (no_factory != NULL) { /* nothing sent yet: Triton answers every request with this error */
    free(slots);
    return no_factory;
  }
  state->executions += 1;

  int32_t nulls = 0;
  for (uint32_t i = 0; i < count; ++i) { /* step 1 */
    if (slots[i].kind == SKIPPED_NULL) ++nulls;
    else admit(state, requests[i], &slots[i]);
  }
  stamps[1] = lab_now_ns();
  uint32_t batch = forward(state, slots, count); /* step 2 */
  if (batch > 0) pace(state->model, stamps[1], batch); /* step 3 */
  stamps[2] = lab_now_ns();
  for (uint32_t i = 0; i < count; ++i) { /* step 4 */
    if (slots[i].kind != ACTIVE || cancelled_now(&slots[i], requests[i])) continue;
    TRITONSERVER_Error* err = stream_token(state, requests[i], &slots[i], (int32_t)batch, nulls);
    slots[i].ok = err == NULL;
    if (err != NULL) {
      LAB_LOG(TRITONSERVER_LOG_ERROR, "%s: sending a token failed: %s", BACKEND, TRITONSERVER_ErrorMessage(err));
      TRITONSERVER_ErrorDelete(err);
    }
  }
  stamps[3] = lab_now_ns();
  for (uint32_t i = 0; i < count; ++i) release(instance, requests[i], &slots[i], stamps); /* step 5 */
  if (batch > 0) {
    TRITONSERVER_Error* err = TRITONBACKEND_ModelInstanceReportBatchStatistics(
        instance, batch, stamps[0], stamps[1], stamps[2], stamps[3]);
    if (err != NULL) TRITONSERVER_ErrorDelete(err);
  }
  free(slots);
  return NULL;
}
