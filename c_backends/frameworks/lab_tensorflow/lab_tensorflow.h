/*
 * lab_tensorflow.h - what the two files of backend "lab_tensorflow" share: its types and the
 * helpers both call.
 *
 *   lab_tensorflow.c        loading (config, SavedModel, session) and Execute: RESPONSES, CHECK,
 *                           RUN (TF_SessionRun once per batch), REPORT and RELEASE;
 *   lab_tensorflow_batch.c  GATHER (every request's rows into one TF_Tensor) and SCATTER (each
 *                           request's rows of the result into its response): notebook 09c's exercise
 *                           asks for this file's two functions, and its checker builds the learner's
 *                           file with lab_tensorflow.c in place of this one.
 *
 * Both files are built into one library (lab_backends/server/native_backends.py build_tensorflow,
 * -fvisibility=hidden: nothing here is exported but the TRITONBACKEND_* entry points).
 */
#ifndef LAB_TENSORFLOW_H
#define LAB_TENSORFLOW_H

#include <limits.h>

#include "tensorflow/c/c_api.h"

#include "lab_backend_util.h"
#include "tf_proto.h" /* TF_MAX_DIMS, TfTensorInfo */

#define BACKEND "lab_tensorflow"

/* One tensor of the config: name, type, dims without the batch dimension (-1: any size). */
typedef struct {
  char name[128];
  TRITONSERVER_DataType dtype;
  const char* dtype_name; /* "TYPE_FP32", for messages */
  int dims;
  int64_t shape[TF_MAX_DIMS];
} ConfigTensor;

/* Per model: what the config says, and where the files are. */
typedef struct {
  char name[128];
  char config_file[PATH_MAX]; /* <model folder>/config.pbtxt, named in load errors */
  char savedmodel[PATH_MAX];  /* <model folder>/<version>/<default_model_filename> */
  char signature[128];
  char tag[64];
  uint32_t intra_threads, inter_threads;
  bool per_session_threads;
  ConfigTensor input, output;
} TfModel;

/* Per instance: its own session (Triton's tensorflow_backend also gives each instance one, unless
 * MAX_SESSION_SHARE_COUNT says otherwise), and the graph tensors the signature names. */
typedef struct {
  TfModel* model;
  TF_Graph* graph;
  TF_Session* session;
  TF_Output input, output;
  TfTensorInfo input_info, output_info;
  int64_t row_shape[TF_MAX_DIMS]; /* one input row: the config's dims, -1s filled from the signature */
} TfInstance;

/* Per request inside one Execute call. */
typedef struct {
  TRITONBACKEND_Response* response; /* NULL once answered (or if it could not be created) */
  LabInput input;                   /* its input, checked: type and rank [rows, ...], rows >= 1 */
  uint64_t rows;   /* this request's own batch size: the first dimension of its input */
  uint64_t offset; /* its first row in the gathered batch */
  bool ok;         /* still to be answered with a result */
} Slot;

/* A data type as the config names it, as Triton and as TensorFlow know it. */
typedef struct {
  const char* config_name;
  TRITONSERVER_DataType triton;
  TF_DataType tf;
  const char* tf_name;
} TfType;

/* Every type the backend serves; type_by_triton(dtype) is the index of a Triton type in it (-1: none). */
extern const TfType TYPES[];
int type_by_triton(TRITONSERVER_DataType dtype);

/* lab_errorf with room for two paths, and newlines flattened: one line in the server log. */
__attribute__((format(printf, 2, 3))) TRITONSERVER_Error* tf_errorf(TRITONSERVER_Error_Code code,
                                                                      const char* fmt, ...);

/* "[-1, 64]" for messages. */
const char* shape_text(const int64_t* shape, int dims, char* out, size_t size);

/* Answer one request with an error now; its batch-mates go on (recommended.cc's
 * RESPOND_AND_SET_NULL_IF_ERROR: a NULL response means "already answered"). */
void fail(Slot* slot, TRITONSERVER_Error* err);

/* lab_tensorflow_batch.c. gather: one TF_Tensor [*total rows, row shape...] holding every good
 * request's rows (slots[i].ok), each at its offset; sets each slot's rows and offset and *total;
 * NULL when nothing is left to run. Execute runs it once and deletes it.
 * scatter: each good request's rows of result ([total rows, output dims...], deleted by Execute)
 * into its own response, shaped [its rows, output dims...], and sent. */
TF_Tensor* gather(const TfInstance* in, Slot* slots, uint32_t count, uint64_t* total);
void scatter(const TfInstance* in, const TF_Tensor* result, Slot* slots, uint32_t count, uint64_t total);

#endif /* LAB_TENSORFLOW_H */
