/*
 * lab_tensorflow.c - backend "lab_tensorflow": a TensorFlow SavedModel served in-process, in C,
 * through TensorFlow's C API (the tensorflow-cpu wheel's libtensorflow_cc.so.2).
 *
 * What every framework backend does, and Triton's own tensorflow_backend / pytorch_backend do in
 * C++ (pytorch_backend src/libtorch.cc ProcessRequests, ~L1265-1420 at r24.10):
 *   load:     the model file once per instance (here a SavedModel, TF_LoadSessionFromSavedModel),
 *             the framework's threads set from the config;
 *   execute:  GATHER every request of the batch into one framework tensor (backend
 *             src/backend_input_collector.cc does it for Triton's backends), RUN the framework once
 *             (TF_SessionRun), SCATTER each request's rows of the result into its own response
 *             (src/backend_output_responder.cc), report statistics, release.
 * Each step is one function, commented with the Triton rule it follows: GATHER and SCATTER are in
 * lab_tensorflow_batch.c (notebook 09c's exercise asks for them), the rest below. Unlike the Python
 * backend there is no stub process and no shared-memory hop: the batch goes from Triton's request
 * buffers into a TF_Tensor and back in this process.
 *
 * The config names everything (Triton's tensorflow_backend uses the same parameter names: its
 * README "Parameters", read in src/tensorflow.cc:1066-1135 at r24.10): input and output tensors
 * (exactly one of each; their names are the signature's keys), default_model_filename (the
 * SavedModel folder in the version folder, default "model.savedmodel"), TF_SIGNATURE_DEF
 * (default "serving_default"), TF_GRAPH_TAG (default "serve"), TF_NUM_INTRA_THREADS /
 * TF_NUM_INTER_THREADS (0 or absent: TensorFlow's choice), TF_USE_PER_SESSION_THREADS
 * ("1"/"true"/"yes"/"on"). The graph tensors behind the signature's keys are read from the
 * SavedModel itself (tf_proto.h), never guessed.
 * TensorFlow's thread pools belong to the process: the first session's sizes serve every later
 * session unless TF_USE_PER_SESSION_THREADS gives it pools of its own (measured here: a second
 * model asking for 6 inter-op threads added 2 threads without it, 8 with it; tests/
 * test_native_frameworks.py checks the per-session case).
 *
 * Build: lab_backends.server.native_backends.build_tensorflow() (this file and lab_tensorflow_batch.c,
 * gcc -Wall -Wextra -Werror, -Wl,-z,defs against libtritonserver and the wheel's TensorFlow
 * libraries, rpath to them).
 */
#include <errno.h>
#include <strings.h>
#include <sys/stat.h>

#include "config_json.h"
#include "lab_tensorflow.h" /* the types and helpers lab_tensorflow_batch.c shares */

#define DEFAULT_FILENAME "model.savedmodel"
#define DEFAULT_SIGNATURE "serving_default"
#define DEFAULT_TAG "serve"
#define MAX_THREADS 1024

/* ------------------------------------------------------------------ errors, one line each */

/* lab_errorf with room for two paths, and newlines (TensorFlow's messages have some) flattened:
 * a load error must read as one line in the server log and in the repository index. */
TRITONSERVER_Error* tf_errorf(TRITONSERVER_Error_Code code, const char* fmt, ...) {
  char msg[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  for (char* c = msg; *c; ++c) {
    if (*c == '\n' || *c == '\r') *c = ' ';
  }
  return TRITONSERVER_ErrorNew(code, msg);
}

/* ------------------------------------------------------------------ types: Triton <-> TensorFlow */

const TfType TYPES[] = {
    {"TYPE_FP32", TRITONSERVER_TYPE_FP32, TF_FLOAT, "DT_FLOAT"},
    {"TYPE_FP64", TRITONSERVER_TYPE_FP64, TF_DOUBLE, "DT_DOUBLE"},
    {"TYPE_FP16", TRITONSERVER_TYPE_FP16, TF_HALF, "DT_HALF"},
    {"TYPE_BF16", TRITONSERVER_TYPE_BF16, TF_BFLOAT16, "DT_BFLOAT16"},
    {"TYPE_INT8", TRITONSERVER_TYPE_INT8, TF_INT8, "DT_INT8"},
    {"TYPE_INT16", TRITONSERVER_TYPE_INT16, TF_INT16, "DT_INT16"},
    {"TYPE_INT32", TRITONSERVER_TYPE_INT32, TF_INT32, "DT_INT32"},
    {"TYPE_INT64", TRITONSERVER_TYPE_INT64, TF_INT64, "DT_INT64"},
    {"TYPE_UINT8", TRITONSERVER_TYPE_UINT8, TF_UINT8, "DT_UINT8"},
    {"TYPE_UINT16", TRITONSERVER_TYPE_UINT16, TF_UINT16, "DT_UINT16"},
    {"TYPE_UINT32", TRITONSERVER_TYPE_UINT32, TF_UINT32, "DT_UINT32"},
    {"TYPE_UINT64", TRITONSERVER_TYPE_UINT64, TF_UINT64, "DT_UINT64"},
    {"TYPE_BOOL", TRITONSERVER_TYPE_BOOL, TF_BOOL, "DT_BOOL"},
};
#define N_TYPES (sizeof TYPES / sizeof TYPES[0])

static int type_by_config_name(const char* name) {
  for (size_t i = 0; i < N_TYPES; ++i) {
    if (strcmp(TYPES[i].config_name, name) == 0) return (int)i;
  }
  return -1;
}

int type_by_triton(TRITONSERVER_DataType dtype) {
  for (size_t i = 0; i < N_TYPES; ++i) {
    if (TYPES[i].triton == dtype) return (int)i;
  }
  return -1;
}

static const char* tf_type_name(int dtype) {
  for (size_t i = 0; i < N_TYPES; ++i) {
    if ((int)TYPES[i].tf == dtype) return TYPES[i].tf_name;
  }
  return dtype == TF_STRING ? "DT_STRING" : "an unsupported DataType";
}

/* "[-1, 64]" for messages. */
const char* shape_text(const int64_t* shape, int dims, char* out, size_t size) {
  size_t used = (size_t)snprintf(out, size, "[");
  for (int d = 0; d < dims && used < size; ++d) {
    used += (size_t)snprintf(out + used, size - used, "%s%lld", d ? ", " : "", (long long)shape[d]);
  }
  if (used < size) snprintf(out + used, size - used, "]");
  return out;
}

/* ------------------------------------------------------------------ backend */

/* TRITONBACKEND_Initialize runs once, when the first model using this backend loads (core
 * src/backend_manager.cc at r24.10): the place to check the API version. Too late to set
 * TensorFlow's own switches: it reads TF_CPP_MIN_LOG_LEVEL and TF_ENABLE_ONEDNN_OPTS while its
 * library is loaded, with ours, before this runs. The server's environment carries them
 * (lab_backends/server/bundle.py server_environment): the quiet log and plain kernels of the
 * Python-wrapped digits_tf. */
TRITONSERVER_Error* TRITONBACKEND_Initialize(TRITONBACKEND_Backend* backend) {
  (void)backend;
  LAB_LOG(TRITONSERVER_LOG_INFO, "%s: TensorFlow %s, C API", BACKEND, TF_Version());
  return lab_check_api_version(BACKEND);
}

/* ------------------------------------------------------------------ model: read the config */

/* One tensor of "input" or "output": exactly one is supported (the gather and scatter below move
 * one tensor; Triton's backends loop the same code over every input and output). */
static TRITONSERVER_Error* read_config_tensor(const TfModel* m, const char* json, const char* list,
                                              ConfigTensor* t) {
  size_t count = 0;
  const char* tensor = json_element(json_member(json, list), 0, &count);
  if (count != 1 || tensor == NULL) {
    return tf_errorf(TRITONSERVER_ERROR_INVALID_ARG,
                     "%s: model '%s': %s declares %zu %s tensors; this backend serves exactly one "
                     "input and one output: keep one in %s[ ... ] in %s",
                     BACKEND, m->name, m->config_file, count, list, list, m->config_file);
  }
  char dtype[32] = "";
  if (!json_string(json_member(tensor, "name"), t->name, sizeof t->name) ||
      !json_string(json_member(tensor, "data_type"), dtype, sizeof dtype)) {
    return tf_errorf(TRITONSERVER_ERROR_INVALID_ARG, "%s: model '%s': the %s in %s needs a name "
                     "and a data_type", BACKEND, m->name, list, m->config_file);
  }
  int type = type_by_config_name(dtype);
  if (type < 0) {
    return tf_errorf(TRITONSERVER_ERROR_INVALID_ARG,
                     "%s: model '%s': %s '%s' has data_type %s, which this backend does not move "
                     "(numeric types only); fix data_type in %s",
                     BACKEND, m->name, list, t->name, dtype, m->config_file);
  }
  t->dtype = TYPES[type].triton;
  t->dtype_name = TYPES[type].config_name;
  const char* dims = json_member(tensor, "dims");
  size_t n = 0;
  json_element(dims, 0, &n);
  if (n > TF_MAX_DIMS - 1) {
    return tf_errorf(TRITONSERVER_ERROR_INVALID_ARG, "%s: model '%s': %s '%s' has %zu dims, at most "
                     "%d here; fix dims in %s", BACKEND, m->name, list, t->name, n, TF_MAX_DIMS - 1,
                     m->config_file);
  }
  t->dims = (int)n;
  for (size_t d = 0; d < n; ++d) {
    size_t ignored = 0;
    if (!json_int(json_element(dims, d, &ignored), &t->shape[d])) {
      return tf_errorf(TRITONSERVER_ERROR_INVALID_ARG, "%s: model '%s': dims of '%s' in %s are not "
                       "integers", BACKEND, m->name, t->name, m->config_file);
    }
  }
  return NULL;
}

/* A thread count parameter: absent or "0" means TensorFlow's own choice (config.proto). */
static TRITONSERVER_Error* read_threads(const TfModel* m, const char* json, const char* key,
                                        uint32_t* out) {
  char text[32] = "";
  bool found = false;
  LAB_RETURN_IF_ERROR(lab_json_parameter(json, key, text, sizeof text, &found));
  *out = 0;
  if (!found) return NULL;
  errno = 0;
  char* end = NULL;
  unsigned long v = strtoul(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0' || text[0] == '-' || v > MAX_THREADS) {
    return tf_errorf(TRITONSERVER_ERROR_INVALID_ARG,
                     "%s: model '%s': parameter %s must be a whole number 0..%d (0: TensorFlow "
                     "chooses), got '%s'; fix parameters { key: \"%s\" ... } in %s",
                     BACKEND, m->name, key, MAX_THREADS, text, key, m->config_file);
  }
  *out = (uint32_t)v;
  return NULL;
}

/* Everything the config says, into 'm'. Where the files are comes from Triton: the model folder
 * (TRITONBACKEND_ModelRepository, tritonbackend.h ~L1016-1031 at r24.10) and the version. */
static TRITONSERVER_Error* read_config(TRITONBACKEND_Model* model, TfModel* m) {
  const char* name = NULL;
  const char* folder = NULL;
  uint64_t version = 0;
  TRITONBACKEND_ArtifactType artifact = TRITONBACKEND_ARTIFACT_FILESYSTEM;
  LAB_RETURN_IF_ERROR(TRITONBACKEND_ModelName(model, &name));
  LAB_RETURN_IF_ERROR(TRITONBACKEND_ModelVersion(model, &version));
  LAB_RETURN_IF_ERROR(TRITONBACKEND_ModelRepository(model, &artifact, &folder));
  snprintf(m->name, sizeof m->name, "%s", name);
  snprintf(m->config_file, sizeof m->config_file, "%s/config.pbtxt", folder);

  char* json = NULL;
  LAB_RETURN_IF_ERROR(lab_model_config_json(model, &json));
  TRITONSERVER_Error* err = NULL;
  char filename[256] = "";
  bool found = false;
  if (lab_json_int(json, "max_batch_size") < 1) {
    err = tf_errorf(TRITONSERVER_ERROR_INVALID_ARG,
                    "%s: model '%s': max_batch_size is 0, but this backend gathers requests along "
                    "the first dimension; set max_batch_size: 1 or more in %s",
                    BACKEND, m->name, m->config_file);
  }
  if (err == NULL && !json_string(json_member(json, "default_model_filename"), filename, sizeof filename)) {
    filename[0] = '\0';
  }
  if (err == NULL) {
    snprintf(m->savedmodel, sizeof m->savedmodel, "%s/%llu/%s", folder, (unsigned long long)version,
             filename[0] ? filename : DEFAULT_FILENAME);
    snprintf(m->signature, sizeof m->signature, DEFAULT_SIGNATURE);
    snprintf(m->tag, sizeof m->tag, DEFAULT_TAG);
    err = lab_json_parameter(json, "TF_SIGNATURE_DEF", m->signature, sizeof m->signature, &found);
  }
  if (err == NULL) err = lab_json_parameter(json, "TF_GRAPH_TAG", m->tag, sizeof m->tag, &found);
  if (err == NULL) err = read_threads(m, json, "TF_NUM_INTRA_THREADS", &m->intra_threads);
  if (err == NULL) err = read_threads(m, json, "TF_NUM_INTER_THREADS", &m->inter_threads);
  if (err == NULL) {
    char flag[16] = "";
    err = lab_json_parameter(json, "TF_USE_PER_SESSION_THREADS", flag, sizeof flag, &found);
    m->per_session_threads = found && (!strcasecmp(flag, "1") || !strcasecmp(flag, "true") ||
                                       !strcasecmp(flag, "yes") || !strcasecmp(flag, "on"));
  }
  if (err == NULL) err = read_config_tensor(m, json, "input", &m->input);
  if (err == NULL) err = read_config_tensor(m, json, "output", &m->output);
  free(json);
  return err;
}

/* A missing SavedModel fails the load now, naming the folder and how to make it, instead of a
 * TensorFlow message about a protobuf file later. */
static TRITONSERVER_Error* check_savedmodel(const TfModel* m) {
  char pb[PATH_MAX + 32];
  struct stat st;
  snprintf(pb, sizeof pb, "%s/saved_model.pb", m->savedmodel);
  if (stat(pb, &st) == 0 && S_ISREG(st.st_mode)) return NULL;
  /* INVALID_ARG, not NOT_FOUND: the config names a folder that holds no model. */
  return tf_errorf(TRITONSERVER_ERROR_INVALID_ARG,
                   "%s: model '%s': no SavedModel at %s (saved_model.pb missing); run `lab-backends "
                   "build-models` to export it there, or name the SavedModel folder with "
                   "default_model_filename in %s",
                   BACKEND, m->name, m->savedmodel, m->config_file);
}

/* TRITONBACKEND_ModelInitialize: once per model (version) load; an error fails the load (core
 * src/backend_model.cc at r24.10). Reads and checks the config and the files; the framework
 * itself is loaded per instance. Triton calls ModelFinalize even after a failed ModelInitialize:
 * the error unwinds the unique_ptr holding the model (backend_model.cc L169-175), whose destructor
 * calls the fini function unconditionally (L983-987). So the state is set last, once everything
 * succeeded: a failure frees what it made and leaves the state NULL, and ModelFinalize frees
 * nothing then. (Set it earlier and free it here too, and ModelFinalize frees it again.) */
TRITONSERVER_Error* TRITONBACKEND_ModelInitialize(TRITONBACKEND_Model* model) {
  TfModel* m = calloc(1, sizeof *m);
  if (m == NULL) return tf_errorf(TRITONSERVER_ERROR_INTERNAL, "%s: out of memory", BACKEND);
  TRITONSERVER_Error* err = read_config(model, m);
  if (err == NULL) err = check_savedmodel(m);
  if (err == NULL) err = TRITONBACKEND_ModelSetState(model, m);
  if (err != NULL) {
    free(m); /* the state was never set: ModelFinalize, which runs anyway, finds NULL */
    return err;
  }
  LAB_LOG(TRITONSERVER_LOG_INFO, "%s: model '%s': SavedModel %s, signature '%s', tag '%s', threads "
          "intra %u inter %u%s", BACKEND, m->name, m->savedmodel, m->signature, m->tag,
          m->intra_threads, m->inter_threads, m->per_session_threads ? " (per session)" : "");
  return NULL;
}

/* TRITONBACKEND_ModelFinalize: after every instance is finalized, at unload, and after a failed
 * load too (a failed ModelInitialize or ModelInstanceInitialize destroys the model): the state is
 * NULL when ModelInitialize failed. */
TRITONSERVER_Error* TRITONBACKEND_ModelFinalize(TRITONBACKEND_Model* model) {
  void* state = NULL;
  LAB_RETURN_IF_ERROR(TRITONBACKEND_ModelState(model, &state));
  if (state == NULL) {
    const char* name = "?";
    LAB_RETURN_IF_ERROR(TRITONBACKEND_ModelName(model, &name));
    LAB_LOG(TRITONSERVER_LOG_INFO, "%s: model '%s': ModelFinalize with no state: its ModelInitialize "
            "failed", BACKEND, name);
  }
  free(state);
  return NULL;
}

/* ------------------------------------------------------------------ instance: load TensorFlow */

/* Load the SavedModel into a new session whose thread pools come from the config (TF_SetConfig
 * takes a serialized ConfigProto, written by tf_config_proto). Also returns the MetaGraphDef. */
static TRITONSERVER_Error* load_session(TfInstance* in, TF_Buffer* meta_graph) {
  const TfModel* m = in->model;
  TF_Status* status = TF_NewStatus();
  TF_SessionOptions* options = TF_NewSessionOptions();
  uint8_t config[40];
  size_t config_len = tf_config_proto(config, m->intra_threads, m->inter_threads, m->per_session_threads);
  TRITONSERVER_Error* err = NULL;
  if (config_len > 0) {
    TF_SetConfig(options, config, config_len, status);
    if (TF_GetCode(status) != TF_OK) {
      err = tf_errorf(TRITONSERVER_ERROR_INTERNAL, "%s: model '%s': TensorFlow refused the thread "
                      "settings: %s", BACKEND, m->name, TF_Message(status));
    }
  }
  if (err == NULL) {
    const char* tags[] = {m->tag};
    in->graph = TF_NewGraph();
    in->session = TF_LoadSessionFromSavedModel(options, NULL, m->savedmodel, tags, 1, in->graph,
                                               meta_graph, status);
    if (TF_GetCode(status) != TF_OK || in->session == NULL) {
      in->session = NULL;
      err = tf_errorf(TRITONSERVER_ERROR_INVALID_ARG,
                      "%s: model '%s': TensorFlow could not load %s with tag '%s': %s; check the "
                      "SavedModel (saved_model_cli show --dir %s) and TF_GRAPH_TAG in %s",
                      BACKEND, m->name, m->savedmodel, m->tag, TF_Message(status), m->savedmodel,
                      m->config_file);
    }
  }
  TF_DeleteSessionOptions(options);
  TF_DeleteStatus(status);
  return err;
}

/* Find the config's tensor among the signature's inputs or outputs and check that they agree on
 * type and shape: a config that disagrees with the model fails the load, naming the fix. */
static TRITONSERVER_Error* bind_tensor(const TfModel* m, PbSpan signature, uint32_t field,
                                       const ConfigTensor* t, TfTensorInfo* info) {
  const char* side = field == SIGNATURE_INPUTS ? "input" : "output";
  char keys[512];
  PbSpan value;
  bool found = false;
  if (!pb_map_find(signature, field, t->name, &value, &found, keys, sizeof keys) ||
      (found && !pb_tensor_info(value, info))) {
    return tf_errorf(TRITONSERVER_ERROR_INVALID_ARG, "%s: model '%s': the %ss of signature '%s' "
                     "in %s are malformed; export the SavedModel again (lab-backends build-models)",
                     BACKEND, m->name, side, m->signature, m->savedmodel);
  }
  if (!found) {
    return tf_errorf(TRITONSERVER_ERROR_INVALID_ARG,
                     "%s: model '%s': %s '%s' is not in signature '%s' of %s (its %ss: %s); rename "
                     "the %s in %s to one of those",
                     BACKEND, m->name, side, t->name, m->signature, m->savedmodel, side,
                     keys[0] ? keys : "none", side, m->config_file);
  }
  int type = type_by_triton(t->dtype);
  if (type < 0 || (int)TYPES[type].tf != info->dtype) {
    const char* want = "a type this backend does not move";
    for (size_t i = 0; i < N_TYPES; ++i) {
      if ((int)TYPES[i].tf == info->dtype) want = TYPES[i].config_name;
    }
    return tf_errorf(TRITONSERVER_ERROR_INVALID_ARG,
                     "%s: model '%s': %s '%s' is %s in %s but %s in signature '%s' of %s; set "
                     "data_type: %s for '%s' in %s",
                     BACKEND, m->name, side, t->name, t->dtype_name, m->config_file,
                     tf_type_name(info->dtype), m->signature, m->savedmodel, want, t->name,
                     m->config_file);
  }
  /* The signature's shape includes the batch dimension; the config's dims do not. */
  bool fits = info->dims < 0 || info->dims == t->dims + 1;
  for (int d = 0; fits && info->dims > 0 && d < t->dims; ++d) {
    int64_t model_dim = info->shape[d + 1], config_dim = t->shape[d];
    fits = model_dim < 0 || config_dim < 0 || model_dim == config_dim;
  }
  if (!fits) {
    char have[96], want[96];
    return tf_errorf(TRITONSERVER_ERROR_INVALID_ARG,
                     "%s: model '%s': %s '%s' has dims %s in %s, but signature '%s' of %s says %s "
                     "with the batch first; set dims to match in %s",
                     BACKEND, m->name, side, t->name, shape_text(t->shape, t->dims, have, sizeof have),
                     m->config_file, m->signature, m->savedmodel,
                     shape_text(info->shape, info->dims, want, sizeof want), m->config_file);
  }
  return NULL;
}

/* "serving_default_PIXELS:0" -> the graph's operation and output index. */
static TRITONSERVER_Error* graph_output(const TfInstance* in, const TfTensorInfo* info, TF_Output* out) {
  char op[sizeof info->name];
  snprintf(op, sizeof op, "%s", info->name);
  char* colon = strrchr(op, ':');
  long index = 0;
  if (colon != NULL) {
    *colon = '\0';
    index = strtol(colon + 1, NULL, 10);
  }
  out->oper = TF_GraphOperationByName(in->graph, op);
  out->index = (int)index;
  if (out->oper == NULL || index < 0 || index >= TF_OperationNumOutputs(out->oper)) {
    return tf_errorf(TRITONSERVER_ERROR_INVALID_ARG, "%s: model '%s': signature '%s' names tensor "
                     "'%s', which the graph of %s does not have; export the SavedModel again",
                     BACKEND, in->model->name, in->model->signature, info->name, in->model->savedmodel);
  }
  return NULL;
}

/* Read the signature the config names out of the MetaGraphDef, bind input and output to it. */
static TRITONSERVER_Error* bind_signature(TfInstance* in, const TF_Buffer* meta_graph) {
  const TfModel* m = in->model;
  PbSpan meta = {(const uint8_t*)meta_graph->data, (const uint8_t*)meta_graph->data + meta_graph->length};
  PbSpan signature;
  bool found = false;
  char names[512];
  if (!pb_map_find(meta, META_GRAPH_SIGNATURE_DEF, m->signature, &signature, &found, names, sizeof names)) {
    return tf_errorf(TRITONSERVER_ERROR_INVALID_ARG, "%s: model '%s': the MetaGraphDef of %s is "
                     "malformed; export the SavedModel again", BACKEND, m->name, m->savedmodel);
  }
  if (!found) {
    return tf_errorf(TRITONSERVER_ERROR_INVALID_ARG,
                     "%s: model '%s': %s has no signature '%s' (its signatures: %s); set parameters "
                     "{ key: \"TF_SIGNATURE_DEF\" value { string_value: \"...\" } } to one of those in %s",
                     BACKEND, m->name, m->savedmodel, m->signature, names[0] ? names : "none",
                     m->config_file);
  }
  LAB_RETURN_IF_ERROR(bind_tensor(m, signature, SIGNATURE_INPUTS, &m->input, &in->input_info));
  LAB_RETURN_IF_ERROR(bind_tensor(m, signature, SIGNATURE_OUTPUTS, &m->output, &in->output_info));
  LAB_RETURN_IF_ERROR(graph_output(in, &in->input_info, &in->input));
  LAB_RETURN_IF_ERROR(graph_output(in, &in->output_info, &in->output));
  for (int d = 0; d < m->input.dims; ++d) { /* a -1 in the config, fixed in the model: the model's */
    int64_t model_dim = in->input_info.dims > 0 ? in->input_info.shape[d + 1] : -1;
    in->row_shape[d] = m->input.shape[d] >= 0 ? m->input.shape[d] : model_dim;
  }
  return NULL;
}

static void close_session(TfInstance* in) {
  TF_Status* status = TF_NewStatus();
  if (in->session != NULL) {
    TF_CloseSession(in->session, status);
    TF_DeleteSession(in->session, status);
  }
  if (in->graph != NULL) TF_DeleteGraph(in->graph);
  TF_DeleteStatus(status);
  free(in);
}

/* TRITONBACKEND_ModelInstanceInitialize: once per instance of instance_group; an error fails the
 * load. Each instance gets its own session, so two instances run TF_SessionRun side by side. As for
 * the model, Triton calls ModelInstanceFinalize even after a failed ModelInstanceInitialize (core
 * src/backend_model_instance.cc L305-311 unwinds the unique_ptr, whose destructor calls the fini
 * function, L209-214 at r24.10): the state is set last, so a failure closes what it opened and
 * ModelInstanceFinalize finds NULL. */
TRITONSERVER_Error* TRITONBACKEND_ModelInstanceInitialize(TRITONBACKEND_ModelInstance* instance) {
  TRITONBACKEND_Model* model = NULL;
  const char* name = NULL;
  LAB_RETURN_IF_ERROR(TRITONBACKEND_ModelInstanceName(instance, &name));
  LAB_RETURN_IF_ERROR(TRITONBACKEND_ModelInstanceModel(instance, &model));
  void* model_state = NULL;
  LAB_RETURN_IF_ERROR(TRITONBACKEND_ModelState(model, &model_state));
  TfInstance* in = calloc(1, sizeof *in);
  if (in == NULL) return tf_errorf(TRITONSERVER_ERROR_INTERNAL, "%s: out of memory", BACKEND);
  in->model = model_state;
  uint64_t started = lab_now_ns();
  TF_Buffer* meta_graph = TF_NewBuffer();
  TRITONSERVER_Error* err = load_session(in, meta_graph);
  if (err == NULL) err = bind_signature(in, meta_graph);
  TF_DeleteBuffer(meta_graph);
  if (err == NULL) err = TRITONBACKEND_ModelInstanceSetState(instance, in);
  if (err != NULL) {
    close_session(in); /* the state was never set: ModelInstanceFinalize finds NULL */
    return err;
  }
  LAB_LOG(TRITONSERVER_LOG_INFO, "%s: instance '%s': session loaded in %.0f ms; '%s' <- %s, '%s' -> %s",
          BACKEND, name, (double)(lab_now_ns() - started) / 1e6, in->model->input.name,
          in->input_info.name, in->model->output.name, in->output_info.name);
  return NULL;
}

/* TRITONBACKEND_ModelInstanceFinalize: at unload, before ModelFinalize, and after a failed
 * ModelInstanceInitialize, with the state NULL. */
TRITONSERVER_Error* TRITONBACKEND_ModelInstanceFinalize(TRITONBACKEND_ModelInstance* instance) {
  void* state = NULL;
  LAB_RETURN_IF_ERROR(TRITONBACKEND_ModelInstanceState(instance, &state));
  if (state != NULL) {
    close_session(state);
    return NULL;
  }
  const char* name = "?";
  LAB_RETURN_IF_ERROR(TRITONBACKEND_ModelInstanceName(instance, &name));
  LAB_LOG(TRITONSERVER_LOG_INFO, "%s: instance '%s': ModelInstanceFinalize with no state: its "
          "ModelInstanceInitialize failed", BACKEND, name);
  return NULL;
}

/* ------------------------------------------------------------------ execute */

/* Answer one request with an error now; its batch-mates go on (recommended.cc's
 * RESPOND_AND_SET_NULL_IF_ERROR: a NULL response means "already answered"). */
void fail(Slot* slot, TRITONSERVER_Error* err) {
  lab_send_error(slot->response, err);
  slot->response = NULL;
  slot->ok = false;
}

/* Step 0, RESPONSES: one per request, all made before anything else. If one cannot be made, none
 * is kept and Execute returns the error: Triton still owns the requests then, and answers each
 * with it (backend examples/backends/recommended/src/recommended.cc L509-515 at r24.10). Made one
 * by one during the work, a failed one would leave its request released with no response at all. */
static TRITONSERVER_Error* new_responses(TRITONBACKEND_Request** requests, uint32_t count, Slot* slots) {
  for (uint32_t i = 0; i < count; ++i) {
    TRITONSERVER_Error* err = TRITONBACKEND_ResponseNew(&slots[i].response, requests[i]);
    if (err == NULL) continue;
    for (uint32_t j = 0; j < i; ++j) { /* not sent: still ours to delete */
      TRITONSERVER_Error* del = TRITONBACKEND_ResponseDelete(slots[j].response);
      if (del != NULL) TRITONSERVER_ErrorDelete(del);
      slots[j].response = NULL;
    }
    return err;
  }
  return NULL;
}

/* Step 1, CHECK: a typed input for each request (its response exists: step 0), with the rank the
 * model takes ([rows, ...], rows >= 1). A request the model cannot take is answered with its own error
 * here. Triton already refused what contradicts the config (400 before the batcher); this checks
 * against the model itself. The shape of each request's rows is gather()'s to check
 * (lab_tensorflow_batch.c): gather decides which requests join the batch and where their rows go. */
static void check_requests(const TfInstance* in, TRITONBACKEND_Request** requests, uint32_t count,
                           Slot* slots) {
  const TfModel* m = in->model;
  for (uint32_t i = 0; i < count; ++i) {
    Slot* s = &slots[i];
    TRITONSERVER_Error* err = lab_get_input(BACKEND, requests[i], m->input.name, m->input.dtype, &s->input);
    if (err == NULL && (s->input.dims != (uint32_t)m->input.dims + 1 || s->input.shape[0] < 1)) {
      char want[96];
      err = tf_errorf(TRITONSERVER_ERROR_INVALID_ARG, "%s: input '%s' must be [rows, ...] with "
                      "rows >= 1 and row shape %s", BACKEND, m->input.name,
                      shape_text(in->row_shape, m->input.dims, want, sizeof want));
    }
    if (err != NULL) {
      fail(s, err);
      continue;
    }
    s->ok = true;
  }
}

/* Step 2, GATHER: gather() in lab_tensorflow_batch.c. */

/* Step 3, RUN: the framework once for the whole batch. */
static TF_Tensor* run(const TfInstance* in, TF_Tensor* batch, Slot* slots, uint32_t count) {
  TF_Status* status = TF_NewStatus();
  TF_Tensor* result = NULL;
  TF_SessionRun(in->session, NULL, &in->input, &batch, 1, &in->output, &result, 1, NULL, 0, NULL, status);
  if (TF_GetCode(status) != TF_OK) {
    for (uint32_t i = 0; i < count; ++i) { /* the framework failed the batch: every request says why */
      if (slots[i].ok) {
        fail(&slots[i], tf_errorf(TRITONSERVER_ERROR_INTERNAL, "%s: model '%s': TensorFlow failed "
                                  "the batch: %s", BACKEND, in->model->name, TF_Message(status)));
      }
    }
    if (result != NULL) TF_DeleteTensor(result);
    result = NULL;
  }
  TF_DeleteStatus(status);
  return result;
}

/* Is the framework's result what the config promises: its type, a first dimension of 'total'
 * rows, the config's dims after it? */
static TRITONSERVER_Error* check_result(const TfInstance* in, const TF_Tensor* result, uint64_t total) {
  const ConfigTensor* t = &in->model->output;
  int dims = TF_NumDims(result);
  bool fits = TF_TensorType(result) == TYPES[type_by_triton(t->dtype)].tf && dims == t->dims + 1 &&
              TF_Dim(result, 0) == (int64_t)total;
  for (int d = 0; fits && d < t->dims; ++d) fits = t->shape[d] < 0 || TF_Dim(result, d + 1) == t->shape[d];
  if (fits) return NULL;
  return tf_errorf(TRITONSERVER_ERROR_INTERNAL, "%s: model '%s': TensorFlow returned %s with %d "
                   "dims for %llu rows; the config promises %s [rows + %d dims]", BACKEND,
                   in->model->name, tf_type_name(TF_TensorType(result)), dims,
                   (unsigned long long)total, t->dtype_name, t->dims);
}

/* Step 4, SCATTER: scatter() in lab_tensorflow_batch.c. */

/* Step 5, REPORT and RELEASE: per-request statistics (success or not) before each release, then
 * one batch record with the rows that were answered. These timestamps become the model's
 * statistics: compute_input = gather, compute_infer = TF_SessionRun, compute_output = scatter.
 * pytorch_backend records the batch it was handed instead: every request's rows (src/libtorch.cc
 * L1295-1356 at r24.10), unless every response failed (L1559-1566). The two differ only when a
 * request fails inside a batch: its rows are then in pytorch_backend's batch_stats, not in ours
 * (ours counts the rows served; a request refused by the check never reached TF_SessionRun).
 * Either way each request's own statistics say success or failure, and inference_count grows
 * with the successes' rows only (core src/infer_stats.cc L104-L111): the batch record feeds
 * execution_count and batch_stats (L386-L425). */
static void report(TRITONBACKEND_ModelInstance* instance, TRITONBACKEND_Request** requests,
                   const Slot* slots, uint32_t count, const uint64_t stamps[4]) {
  uint64_t rows = 0;
  for (uint32_t i = 0; i < count; ++i) {
    lab_finish_request(instance, requests[i], slots[i].ok, stamps[0], stamps[1], stamps[2], stamps[3]);
    if (slots[i].ok) rows += slots[i].rows;
  }
  if (rows == 0) return;
  TRITONSERVER_Error* err = TRITONBACKEND_ModelInstanceReportBatchStatistics(
      instance, rows, stamps[0], stamps[1], stamps[2], stamps[3]);
  if (err != NULL) {
    LAB_LOG(TRITONSERVER_LOG_ERROR, "%s: batch statistics: %s", BACKEND, TRITONSERVER_ErrorMessage(err));
    TRITONSERVER_ErrorDelete(err);
  }
}

/* TRITONBACKEND_ModelInstanceExecute: one batch, formed by the dynamic batcher. Until a response
 * exists, returning an error hands the requests back to Triton; after that every request gets a
 * response and a release here, and we return NULL (recommended.cc at r24.10). */
TRITONSERVER_Error* TRITONBACKEND_ModelInstanceExecute(
    TRITONBACKEND_ModelInstance* instance, TRITONBACKEND_Request** requests, uint32_t count) {
  uint64_t stamps[4] = {lab_now_ns(), 0, 0, 0}; /* exec start, compute start, compute end, exec end */
  TfInstance* in = NULL;
  LAB_RETURN_IF_ERROR(TRITONBACKEND_ModelInstanceState(instance, (void**)&in));
  Slot* slots = calloc(count ? count : 1, sizeof *slots);
  if (slots == NULL) return tf_errorf(TRITONSERVER_ERROR_INTERNAL, "%s: out of memory", BACKEND);

  TRITONSERVER_Error* no_response = new_responses(requests, count, slots);
  if (no_response != NULL) { /* nothing sent yet: Triton answers every request with this error */
    free(slots);
    return no_response;
  }
  check_requests(in, requests, count, slots);
  uint64_t total = 0;
  TF_Tensor* batch = gather(in, slots, count, &total);
  stamps[1] = lab_now_ns();
  TF_Tensor* result = batch != NULL ? run(in, batch, slots, count) : NULL;
  stamps[2] = lab_now_ns();
  if (result != NULL) {
    TRITONSERVER_Error* bad = check_result(in, result, total);
    for (uint32_t i = 0; bad != NULL && i < count; ++i) {
      if (slots[i].ok) {
        fail(&slots[i], TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INTERNAL, TRITONSERVER_ErrorMessage(bad)));
      }
    }
    if (bad != NULL) TRITONSERVER_ErrorDelete(bad);
    else scatter(in, result, slots, count, total);
  }
  for (uint32_t i = 0; i < count; ++i) { /* nothing may stay unanswered (e.g. no batch memory) */
    if (slots[i].response != NULL) {
      fail(&slots[i], tf_errorf(TRITONSERVER_ERROR_INTERNAL, "%s: the batch could not run", BACKEND));
    }
  }
  stamps[3] = lab_now_ns();
  report(instance, requests, slots, count, stamps);
  if (batch != NULL) TF_DeleteTensor(batch); /* both tensors are ours: a leak here grows per batch */
  if (result != NULL) TF_DeleteTensor(result);
  free(slots);
  return NULL;
}
