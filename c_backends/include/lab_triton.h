/*
 * lab_triton.h - the part of Triton's backend C API that this workbench's C backends use.
 *
 * Why our own header: the upstream headers (tritonserver.h, tritonbackend.h) are written for C++
 * builds, are not shipped in the nvidia-pytriton wheel, and pull in two more repositories and
 * CMake. A backend only needs a few dozen declarations, so we write them here ourselves, from
 * the public API documentation, for plain C and gcc.
 *
 * Every function below is *implemented by the server* (libtritonserver.so) and called by us,
 * except the "entry points" at the end, which *we* implement and the server calls.
 * Build with lab_backends.cbackend.build(), which links with -Wl,-z,defs so that a misspelled
 * name below (or in a backend) fails at build time instead of at model load.
 *
 * Ownership rules worth remembering (from the API documentation):
 *  - A TRITONSERVER_Error* returned to us is ours: read it, then TRITONSERVER_ErrorDelete() it.
 *  - TRITONBACKEND_ResponseSend() takes the response, but NOT the error passed with it.
 *  - Requests handed to ModelInstanceExecute are ours until TRITONBACKEND_RequestRelease().
 *    Returning an error from Execute hands them back to the server (then send nothing).
 *  - Statistics for a request must be reported before the request is released.
 */
#ifndef LAB_TRITON_H
#define LAB_TRITON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The API version this header describes (the server in nvidia-pytriton 0.7.0 / Triton 2.51). A
 * backend accepts a server with the same major and an equal or newer minor. */
#define LAB_TRITONBACKEND_API_MAJOR 1u
#define LAB_TRITONBACKEND_API_MINOR 19u

/* Entry points must stay visible when compiled with -fvisibility=hidden. */
#define LAB_EXPORT __attribute__((visibility("default")))

/* ---------------------------------------------------------------- opaque handles */
typedef struct TRITONSERVER_Error TRITONSERVER_Error;
typedef struct TRITONSERVER_Message TRITONSERVER_Message;
typedef struct TRITONBACKEND_Backend TRITONBACKEND_Backend;
typedef struct TRITONBACKEND_Model TRITONBACKEND_Model;
typedef struct TRITONBACKEND_ModelInstance TRITONBACKEND_ModelInstance;
typedef struct TRITONBACKEND_Request TRITONBACKEND_Request;
typedef struct TRITONBACKEND_Response TRITONBACKEND_Response;
typedef struct TRITONBACKEND_Input TRITONBACKEND_Input;
typedef struct TRITONBACKEND_Output TRITONBACKEND_Output;
/* Creates responses for one request, also after the request is released (decoupled models). */
typedef struct TRITONBACKEND_ResponseFactory TRITONBACKEND_ResponseFactory;
/* A custom batching strategy's own read-only data, behind an opaque pointer (batching, below). */
typedef struct TRITONBACKEND_Batcher TRITONBACKEND_Batcher;

/* ---------------------------------------------------------------- enumerations (values fixed by the ABI) */
typedef enum {
  TRITONSERVER_TYPE_INVALID = 0,
  TRITONSERVER_TYPE_BOOL = 1,
  TRITONSERVER_TYPE_UINT8 = 2,
  TRITONSERVER_TYPE_UINT16 = 3,
  TRITONSERVER_TYPE_UINT32 = 4,
  TRITONSERVER_TYPE_UINT64 = 5,
  TRITONSERVER_TYPE_INT8 = 6,
  TRITONSERVER_TYPE_INT16 = 7,
  TRITONSERVER_TYPE_INT32 = 8,
  TRITONSERVER_TYPE_INT64 = 9,
  TRITONSERVER_TYPE_FP16 = 10,
  TRITONSERVER_TYPE_FP32 = 11,
  TRITONSERVER_TYPE_FP64 = 12,
  TRITONSERVER_TYPE_BYTES = 13,
  TRITONSERVER_TYPE_BF16 = 14
} TRITONSERVER_DataType;

typedef enum {
  TRITONSERVER_MEMORY_CPU = 0,
  TRITONSERVER_MEMORY_CPU_PINNED = 1,
  TRITONSERVER_MEMORY_GPU = 2
} TRITONSERVER_MemoryType;

typedef enum {
  TRITONSERVER_ERROR_UNKNOWN = 0,
  TRITONSERVER_ERROR_INTERNAL = 1,
  TRITONSERVER_ERROR_NOT_FOUND = 2,
  TRITONSERVER_ERROR_INVALID_ARG = 3,
  TRITONSERVER_ERROR_UNAVAILABLE = 4,
  TRITONSERVER_ERROR_UNSUPPORTED = 5,
  TRITONSERVER_ERROR_ALREADY_EXISTS = 6,
  TRITONSERVER_ERROR_CANCELLED = 7
} TRITONSERVER_Error_Code;

typedef enum {
  TRITONSERVER_LOG_INFO = 0,
  TRITONSERVER_LOG_WARN = 1,
  TRITONSERVER_LOG_ERROR = 2,
  TRITONSERVER_LOG_VERBOSE = 3
} TRITONSERVER_LogLevel;

/* The type of a request parameter (core include/triton/core/tritonserver.h:182-188 at r24.10). For
 * STRING the value is a NUL-terminated char array owned by the request. */
typedef enum {
  TRITONSERVER_PARAMETER_STRING = 0,
  TRITONSERVER_PARAMETER_INT = 1,
  TRITONSERVER_PARAMETER_BOOL = 2,
  TRITONSERVER_PARAMETER_DOUBLE = 3,
  TRITONSERVER_PARAMETER_BYTES = 4
} TRITONSERVER_ParameterType;

/* Flags for TRITONBACKEND_ResponseSend and TRITONBACKEND_RequestRelease (core
 * include/triton/core/tritonserver.h:955-973 at r24.10). RESCHEDULE hands an unfinished request
 * back to the model's scheduler instead of ending it; only a scheduler that handles it accepts it
 * (sequence_batching { iterative_sequence: true }: core src/sequence_batch_scheduler/sequence_utils.cc
 * 32-58), any other model's release fails with INVALID_ARG and the request stays the backend's
 * (core src/infer_request.cc:113-125, src/backend_model.cc:1346-1360). */
#define TRITONSERVER_RESPONSE_COMPLETE_FINAL 1u
#define TRITONSERVER_REQUEST_RELEASE_ALL 1u
#define TRITONSERVER_REQUEST_RELEASE_RESCHEDULE 2u
/* Request flags (TRITONBACKEND_RequestFlags): a sequence's first and last request. The iterative
 * sequencer gives a request without a correlation ID one of its own and SEQUENCE_START
 * (core src/sequence_batch_scheduler/sequence_utils.h:73-90), and clears the flags of a
 * rescheduled one (sequence_utils.cc:36-38). */
#define TRITONSERVER_REQUEST_FLAG_SEQUENCE_START 1u
#define TRITONSERVER_REQUEST_FLAG_SEQUENCE_END 2u

/* ---------------------------------------------------------------- server utilities */
TRITONSERVER_Error* TRITONSERVER_ErrorNew(TRITONSERVER_Error_Code code, const char* msg);
void TRITONSERVER_ErrorDelete(TRITONSERVER_Error* error);
const char* TRITONSERVER_ErrorMessage(TRITONSERVER_Error* error);
const char* TRITONSERVER_ErrorCodeString(TRITONSERVER_Error* error);
const char* TRITONSERVER_DataTypeString(TRITONSERVER_DataType datatype);

/* A message (e.g. the model config) as JSON; the text belongs to the message. */
TRITONSERVER_Error* TRITONSERVER_MessageSerializeToJson(
    TRITONSERVER_Message* message, const char** base, size_t* byte_size);
TRITONSERVER_Error* TRITONSERVER_MessageDelete(TRITONSERVER_Message* message);

TRITONSERVER_Error* TRITONSERVER_LogMessage(
    TRITONSERVER_LogLevel level, const char* filename, int line, const char* msg);

/* ---------------------------------------------------------------- backend, model, instance */
TRITONSERVER_Error* TRITONBACKEND_ApiVersion(uint32_t* major, uint32_t* minor);
TRITONSERVER_Error* TRITONBACKEND_BackendName(TRITONBACKEND_Backend* backend, const char** name);

TRITONSERVER_Error* TRITONBACKEND_ModelName(TRITONBACKEND_Model* model, const char** name);
TRITONSERVER_Error* TRITONBACKEND_ModelVersion(TRITONBACKEND_Model* model, uint64_t* version);
/* Where the model's files are: for FILESYSTEM (the only kind) the model's folder in the repository,
 * a string owned by Triton (core include/triton/core/tritonbackend.h:113-125, 1016-1031 at r24.10). */
typedef enum { TRITONBACKEND_ARTIFACT_FILESYSTEM = 0 } TRITONBACKEND_ArtifactType;
TRITONSERVER_Error* TRITONBACKEND_ModelRepository(
    TRITONBACKEND_Model* model, TRITONBACKEND_ArtifactType* artifact_type, const char** location);
/* config_version 1 is the only one; the caller owns (and deletes) *model_config. */
TRITONSERVER_Error* TRITONBACKEND_ModelConfig(
    TRITONBACKEND_Model* model, uint32_t config_version, TRITONSERVER_Message** model_config);
TRITONSERVER_Error* TRITONBACKEND_ModelSetState(TRITONBACKEND_Model* model, void* state);
TRITONSERVER_Error* TRITONBACKEND_ModelState(TRITONBACKEND_Model* model, void** state);

TRITONSERVER_Error* TRITONBACKEND_ModelInstanceName(
    TRITONBACKEND_ModelInstance* instance, const char** name);
TRITONSERVER_Error* TRITONBACKEND_ModelInstanceModel(
    TRITONBACKEND_ModelInstance* instance, TRITONBACKEND_Model** model);
TRITONSERVER_Error* TRITONBACKEND_ModelInstanceSetState(
    TRITONBACKEND_ModelInstance* instance, void* state);
TRITONSERVER_Error* TRITONBACKEND_ModelInstanceState(
    TRITONBACKEND_ModelInstance* instance, void** state);

/* ---------------------------------------------------------------- requests and inputs */
TRITONSERVER_Error* TRITONBACKEND_RequestId(TRITONBACKEND_Request* request, const char** id);
TRITONSERVER_Error* TRITONBACKEND_RequestInputCount(TRITONBACKEND_Request* request, uint32_t* count);
TRITONSERVER_Error* TRITONBACKEND_RequestInput(
    TRITONBACKEND_Request* request, const char* name, TRITONBACKEND_Input** input);
/* Inputs (and parameters) by index: the order may differ from one request to the next. */
TRITONSERVER_Error* TRITONBACKEND_RequestInputByIndex(
    TRITONBACKEND_Request* request, uint32_t index, TRITONBACKEND_Input** input);
/* The request's own parameters (KServe "parameters" of the infer request); key and value live as
 * long as the request (core include/triton/core/tritonbackend.h:446-474 at r24.10). */
TRITONSERVER_Error* TRITONBACKEND_RequestParameterCount(TRITONBACKEND_Request* request, uint32_t* count);
TRITONSERVER_Error* TRITONBACKEND_RequestParameter(
    TRITONBACKEND_Request* request, uint32_t index, const char** key, TRITONSERVER_ParameterType* type,
    const void** vvalue);
/* shape includes the batch dimension when the model batches; the data may come in several
 * buffers (buffer_count), which must be read one after the other. */
TRITONSERVER_Error* TRITONBACKEND_InputProperties(
    TRITONBACKEND_Input* input, const char** name, TRITONSERVER_DataType* datatype,
    const int64_t** shape, uint32_t* dims_count, uint64_t* byte_size, uint32_t* buffer_count);
/* memory_type / memory_type_id: in = what we prefer, out = where the buffer really is. */
TRITONSERVER_Error* TRITONBACKEND_InputBuffer(
    TRITONBACKEND_Input* input, uint32_t index, const void** buffer, uint64_t* buffer_byte_size,
    TRITONSERVER_MemoryType* memory_type, int64_t* memory_type_id);
/* The sequence a request belongs to (sequence batching): an integer correlation ID, 0 when none; an
 * error when the client sent a string ID (core include/triton/core/tritonbackend.h:404-413 at r24.10). */
TRITONSERVER_Error* TRITONBACKEND_RequestCorrelationId(TRITONBACKEND_Request* request, uint64_t* id);
/* A bitwise-or of TRITONSERVER_REQUEST_FLAG_* (tritonbackend.h:436-444). */
TRITONSERVER_Error* TRITONBACKEND_RequestFlags(TRITONBACKEND_Request* request, uint32_t* flags);
/* True once the client cancelled the request: stop working for it (tritonbackend.h:379-389). */
TRITONSERVER_Error* TRITONBACKEND_RequestIsCancelled(TRITONBACKEND_Request* request, bool* is_cancelled);
/* The output names the client asked for; all of the config's when it named none (core
 * src/infer_request.cc:993-1003 at r24.10). The name belongs to the request (tritonbackend.h:531-553). */
TRITONSERVER_Error* TRITONBACKEND_RequestOutputCount(TRITONBACKEND_Request* request, uint32_t* count);
TRITONSERVER_Error* TRITONBACKEND_RequestOutputName(
    TRITONBACKEND_Request* request, const uint32_t index, const char** output_name);
/* On success the request is no longer ours (tritonbackend.h:582-598). release_flags: ALL ends it;
 * RESCHEDULE (iterative sequence batching only) puts it back in the scheduler's queue, inputs and
 * all, for a later execution. On error the request is still ours. */
TRITONSERVER_Error* TRITONBACKEND_RequestRelease(TRITONBACKEND_Request* request, uint32_t release_flags);

/* ---------------------------------------------------------------- responses and outputs */
TRITONSERVER_Error* TRITONBACKEND_ResponseNew(
    TRITONBACKEND_Response** response, TRITONBACKEND_Request* request);
TRITONSERVER_Error* TRITONBACKEND_ResponseDelete(TRITONBACKEND_Response* response);
TRITONSERVER_Error* TRITONBACKEND_ResponseOutput(
    TRITONBACKEND_Response* response, TRITONBACKEND_Output** output, const char* name,
    TRITONSERVER_DataType datatype, const int64_t* shape, uint32_t dims_count);
TRITONSERVER_Error* TRITONBACKEND_OutputBuffer(
    TRITONBACKEND_Output* output, void** buffer, uint64_t buffer_byte_size,
    TRITONSERVER_MemoryType* memory_type, int64_t* memory_type_id);
/* Takes ownership of 'response' on EVERY call, success or error: never touch or delete it afterwards
 * (core include/triton/core/tritonbackend.h:757-759 at r24.10; core src/backend_model.cc:1637 at
 * r24.10 wraps it in a unique_ptr before sending). 'error' (may be NULL) stays the caller's. */
TRITONSERVER_Error* TRITONBACKEND_ResponseSend(
    TRITONBACKEND_Response* response, uint32_t send_flags, TRITONSERVER_Error* error);

/* ---------------------------------------------------------------- decoupled responses
 * A decoupled model (model_transaction_policy { decoupled: true }) may send any number of responses
 * per request, and must end each request's stream with exactly one FINAL flag: on its last response,
 * or alone with ResponseFactorySendFlags (backend README "Decoupled Responses" at r24.10). A factory
 * is a handle on the request's own response factory (core src/backend_model.cc:1466-1487 at r24.10:
 * a new std::shared_ptr copy), so deleting it ends nothing, and it outlives the request's release
 * (tritonbackend.h:611-619). Signatures: tritonbackend.h:626-688. */
TRITONSERVER_Error* TRITONBACKEND_ResponseFactoryNew(
    TRITONBACKEND_ResponseFactory** factory, TRITONBACKEND_Request* request);
TRITONSERVER_Error* TRITONBACKEND_ResponseFactoryDelete(TRITONBACKEND_ResponseFactory* factory);
/* Flags (FINAL) without a response: how a stream ends when there is nothing more to send. */
TRITONSERVER_Error* TRITONBACKEND_ResponseFactorySendFlags(
    TRITONBACKEND_ResponseFactory* factory, const uint32_t send_flags);
TRITONSERVER_Error* TRITONBACKEND_ResponseFactoryIsCancelled(
    TRITONBACKEND_ResponseFactory* factory, bool* is_cancelled);
/* A response for the factory's request; send it with TRITONBACKEND_ResponseSend (same ownership rule). */
TRITONSERVER_Error* TRITONBACKEND_ResponseNewFromFactory(
    TRITONBACKEND_Response** response, TRITONBACKEND_ResponseFactory* factory);

/* ---------------------------------------------------------------- statistics (CLOCK_MONOTONIC ns) */
TRITONSERVER_Error* TRITONBACKEND_ModelInstanceReportStatistics(
    TRITONBACKEND_ModelInstance* instance, TRITONBACKEND_Request* request, bool success,
    uint64_t exec_start_ns, uint64_t compute_start_ns, uint64_t compute_end_ns,
    uint64_t exec_end_ns);
TRITONSERVER_Error* TRITONBACKEND_ModelInstanceReportBatchStatistics(
    TRITONBACKEND_ModelInstance* instance, uint64_t batch_size, uint64_t exec_start_ns,
    uint64_t compute_start_ns, uint64_t compute_end_ns, uint64_t exec_end_ns);

/* ---------------------------------------------------------------- entry points WE implement
 * Only ModelInstanceExecute is required; the server looks the others up by name and calls the
 * ones it finds: Initialize once per backend, ModelInitialize once per model (version),
 * ModelInstanceInitialize once per instance, then Execute for every batch. On unload,
 * ModelInstanceFinalize for each instance, then ModelFinalize (core src/backend_model.cc:966-987 at
 * r24.10); Finalize only when the backend itself is destroyed, at server shutdown (core
 * src/backend_manager.cc:136-149 at r24.10). A non-NULL error from an initializer fails the load,
 * and the matching finalize still runs, with whatever state was set (NULL if none): the model and
 * the instance are destroyed, and their destructors call the fini functions unconditionally
 * (src/backend_model.cc:169-176, 983-987; src/backend_model_instance.cc:305-311, 209-214). So set
 * the state last, or leave it set and let the finalize free it: never free it and leave it set. */
LAB_EXPORT TRITONSERVER_Error* TRITONBACKEND_Initialize(TRITONBACKEND_Backend* backend);
LAB_EXPORT TRITONSERVER_Error* TRITONBACKEND_Finalize(TRITONBACKEND_Backend* backend);
LAB_EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelInitialize(TRITONBACKEND_Model* model);
LAB_EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelFinalize(TRITONBACKEND_Model* model);
LAB_EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelInstanceInitialize(TRITONBACKEND_ModelInstance* instance);
LAB_EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelInstanceFinalize(TRITONBACKEND_ModelInstance* instance);
LAB_EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelInstanceExecute(
    TRITONBACKEND_ModelInstance* instance, TRITONBACKEND_Request** requests, uint32_t request_count);

/* ---------------------------------------------------------------- a custom batching strategy
 * Not a backend: a library the dynamic batcher loads beside the model's backend, from the model
 * config parameter TRITON_BATCH_STRATEGY_PATH (else a batchstrategy.so in the version, model or
 * backend folder: core src/backend_model.cc:183-221 at r24.10). It must define all five or none
 * (src/backend_model.cc:898-911). BatcherInitialize runs at load (an error fails the load) and
 * BatcherFinalize at unload, also after a failed BatcherInitialize (src/backend_model.cc:913-925,
 * 950-960); BatchInitialize when a batch starts forming, IncludeRequest for each queued request in
 * turn (false closes the batch), BatchFinalize when the batch is formed
 * (src/dynamic_batch_scheduler.cc:292-299, 430-436, 564-571, 796-846). Errors from the three batch
 * functions are only logged. The batch state is reset whenever the batcher resumes a batch it sent
 * but did not close (501-508): c_backends/batching/byte_budget/byte_budget.c says what that means
 * for a model's config. c_backends/batching/ holds ours; notebook 09b reads them. */
LAB_EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelBatcherInitialize(
    TRITONBACKEND_Batcher** batcher, TRITONBACKEND_Model* model);
LAB_EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelBatcherFinalize(TRITONBACKEND_Batcher* batcher);
LAB_EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelBatchInitialize(
    const TRITONBACKEND_Batcher* batcher, void** userp);
LAB_EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelBatchIncludeRequest(
    TRITONBACKEND_Request* request, void* userp, bool* should_include);
LAB_EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelBatchFinalize(void* userp);

#endif /* LAB_TRITON_H */
