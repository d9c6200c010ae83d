/*
 * tf_proto.h - the two protocol buffers lab_tensorflow needs, read and written by hand in C.
 *
 * Why by hand: TensorFlow's C API speaks protobuf at two places and offers no C accessor for them.
 *  - TF_LoadSessionFromSavedModel() returns the loaded MetaGraphDef as serialized bytes. Its
 *    signature_def map is what names the graph tensors behind a signature's keys (the key
 *    "PIXELS" is fed through an op such as "serving_default_PIXELS", output 0). Triton's own
 *    backend reads it with TensorFlow's C++ classes (bundle->meta_graph_def.signature_def(),
 *    tensorflow_backend mirror/tensorflow_backend_tf.cc:984-1011 at r24.10); a C program has only
 *    the bytes.
 *  - TF_SetConfig() takes a serialized ConfigProto (Triton's backend sets the same three fields in
 *    C++: mirror/tensorflow_backend_tf.cc:221-223 at r24.10). The C API's only builder,
 *    TF_CreateConfig() (c_api_experimental.h), sets XLA, GPU growth and the CPU device count, not
 *    the thread pools. The bytes written here were checked against TensorFlow 2.21's own
 *    ConfigProto serialization (intra 1, inter 2, per-session: 10 01 28 02 48 01).
 * So we read and write the protobuf wire format directly: a field is a varint key
 * (field_number << 3 | wire_type) followed by a varint (type 0), 8 bytes (1), a varint length and
 * that many bytes (2: strings, sub-messages, map entries) or 4 bytes (5). A map<K, V> field is a
 * repeated sub-message with the key in field 1 and the value in field 2.
 *
 * The field numbers come from the generated headers shipped in the tensorflow-cpu wheel
 * (tensorflow/include/tensorflow/core/protobuf/meta_graph.pb.h, config.pb.h and
 * core/framework/tensor_shape.pb.h): MetaGraphDef.signature_def = 5; SignatureDef.inputs = 1,
 * .outputs = 2; TensorInfo.name = 1, .dtype = 2, .tensor_shape = 3; TensorShapeProto.dim = 2,
 * .unknown_rank = 3; Dim.size = 1; ConfigProto.intra_op_parallelism_threads = 2,
 * .inter_op_parallelism_threads = 5, .use_per_session_threads = 9.
 */
#ifndef LAB_TF_PROTO_H
#define LAB_TF_PROTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

enum {
  PB_VARINT = 0, PB_FIXED64 = 1, PB_BYTES = 2, PB_FIXED32 = 5,
  META_GRAPH_SIGNATURE_DEF = 5,
  SIGNATURE_INPUTS = 1, SIGNATURE_OUTPUTS = 2,
  TENSOR_INFO_NAME = 1, TENSOR_INFO_DTYPE = 2, TENSOR_INFO_SHAPE = 3,
  SHAPE_DIM = 2, SHAPE_UNKNOWN_RANK = 3, DIM_SIZE = 1,
  MAP_KEY = 1, MAP_VALUE = 2,
  CONFIG_INTRA_OP_THREADS = 2, CONFIG_INTER_OP_THREADS = 5, CONFIG_PER_SESSION_THREADS = 9,
};

/* A byte range being read. */
typedef struct {
  const uint8_t* at;
  const uint8_t* end;
} PbSpan;

/* One field: its number, wire type, and its value (a number, or the bytes of a type-2 field). */
typedef struct {
  uint32_t number;
  uint32_t wire;
  uint64_t value;
  PbSpan bytes;
} PbField;

static __attribute__((unused)) bool pb_varint(PbSpan* s, uint64_t* out) {
  uint64_t v = 0;
  for (int shift = 0; shift < 64 && s->at < s->end; shift += 7) {
    uint8_t b = *s->at++;
    v |= (uint64_t)(b & 0x7f) << shift;
    if (!(b & 0x80)) {
      *out = v;
      return true;
    }
  }
  return false; /* truncated, or longer than 10 bytes */
}

/* The next field of 's'; false at the end or on malformed bytes (*bad tells which). */
static __attribute__((unused)) bool pb_next(PbSpan* s, PbField* f, bool* bad) {
  *bad = false;
  if (s->at >= s->end) return false;
  uint64_t key = 0;
  if (!pb_varint(s, &key)) goto malformed;
  f->number = (uint32_t)(key >> 3);
  f->wire = (uint32_t)(key & 7);
  f->value = 0;
  f->bytes.at = f->bytes.end = NULL;
  switch (f->wire) {
    case PB_VARINT:
      if (!pb_varint(s, &f->value)) goto malformed;
      return true;
    case PB_FIXED64:
    case PB_FIXED32: {
      size_t n = f->wire == PB_FIXED64 ? 8 : 4;
      if ((size_t)(s->end - s->at) < n) goto malformed;
      s->at += n;
      return true;
    }
    case PB_BYTES: {
      uint64_t n = 0;
      if (!pb_varint(s, &n) || n > (uint64_t)(s->end - s->at)) goto malformed;
      f->bytes.at = s->at;
      f->bytes.end = s->at + n;
      s->at += n;
      return true;
    }
    default:
      break;
  }
malformed:
  *bad = true;
  return false;
}

static __attribute__((unused)) bool pb_equals(PbSpan bytes, const char* text) {
  size_t n = strlen(text);
  return (size_t)(bytes.end - bytes.at) == n && memcmp(bytes.at, text, n) == 0;
}

/* Copy a string field into 'out' (NUL-terminated, cut to out_size - 1). */
static __attribute__((unused)) void pb_copy(PbSpan bytes, char* out, size_t out_size) {
  size_t n = (size_t)(bytes.end - bytes.at);
  if (n >= out_size) n = out_size - 1;
  memcpy(out, bytes.at, n);
  out[n] = '\0';
}

/*
 * Find map entry 'key' among the fields numbered 'field' of message 'msg' (a map<string, message>):
 * its value's bytes in *value. When it is absent, 'keys' (if not NULL) lists the keys present,
 * comma-separated, for an error message (not those starting with "__": TensorFlow's own). Returns
 * false only on malformed bytes.
 */
static __attribute__((unused)) bool pb_map_find(PbSpan msg, uint32_t field, const char* key, PbSpan* value, bool* found,
                        char* keys, size_t keys_size) {
  *found = false;
  if (keys != NULL && keys_size > 0) keys[0] = '\0';
  PbField f;
  bool bad = false;
  while (pb_next(&msg, &f, &bad)) {
    if (f.number != field || f.wire != PB_BYTES) continue;
    PbSpan entry = f.bytes, k = {NULL, NULL}, v = {NULL, NULL};
    PbField e;
    bool entry_bad = false;
    while (pb_next(&entry, &e, &entry_bad)) {
      if (e.wire != PB_BYTES) continue;
      if (e.number == MAP_KEY) k = e.bytes;
      if (e.number == MAP_VALUE) v = e.bytes;
    }
    if (entry_bad || k.at == NULL) return false;
    if (v.at == NULL) v.at = v.end = k.end; /* an empty message is sent as no field at all */
    if (pb_equals(k, key)) {
      *value = v;
      *found = true;
      return true;
    }
    /* Listed for the reader, less TensorFlow's own entries (e.g. "__saved_model_init_op"). */
    if (keys != NULL && keys_size > 0 && !(k.end - k.at >= 2 && k.at[0] == '_' && k.at[1] == '_')) {
      size_t used = strlen(keys);
      if (used > 0 && used + 2 < keys_size) strcat(keys, ", ");
      used = strlen(keys);
      if (used + 1 < keys_size) pb_copy(k, keys + used, keys_size - used);
    }
  }
  return !bad;
}

/* A signature's tensor: what TensorInfo says about it. */
#define TF_MAX_DIMS 8
typedef struct {
  char name[256]; /* the graph tensor, "op:index" */
  int dtype;      /* TensorFlow's DataType enum (TF_DataType in the C API) */
  int dims;       /* -1: unknown rank */
  int64_t shape[TF_MAX_DIMS]; /* -1: any size */
} TfTensorInfo;

/* Parse a TensorInfo message. Returns false on malformed bytes or more than TF_MAX_DIMS dims. */
static __attribute__((unused)) bool pb_tensor_info(PbSpan msg, TfTensorInfo* info) {
  memset(info, 0, sizeof *info);
  PbField f;
  bool bad = false;
  while (pb_next(&msg, &f, &bad)) {
    if (f.number == TENSOR_INFO_NAME && f.wire == PB_BYTES) pb_copy(f.bytes, info->name, sizeof info->name);
    if (f.number == TENSOR_INFO_DTYPE && f.wire == PB_VARINT) info->dtype = (int)f.value;
    if (f.number != TENSOR_INFO_SHAPE || f.wire != PB_BYTES) continue;
    PbSpan shape = f.bytes;
    PbField d;
    bool shape_bad = false;
    while (pb_next(&shape, &d, &shape_bad)) {
      if (d.number == SHAPE_UNKNOWN_RANK && d.wire == PB_VARINT && d.value) info->dims = -1;
      if (d.number != SHAPE_DIM || d.wire != PB_BYTES) continue;
      if (info->dims < 0 || info->dims >= TF_MAX_DIMS) return false;
      int64_t size = 0; /* Dim.size is int64: -1 is a ten-byte varint, read as two's complement */
      PbSpan dim = d.bytes;
      PbField s;
      bool dim_bad = false;
      while (pb_next(&dim, &s, &dim_bad)) {
        if (s.number == DIM_SIZE && s.wire == PB_VARINT) size = (int64_t)s.value;
      }
      if (dim_bad) return false;
      info->shape[info->dims++] = size;
    }
    if (shape_bad) return false;
  }
  return !bad;
}

/* Append a varint field to a buffer of at least 11 free bytes; the new length. */
static __attribute__((unused)) size_t pb_put_varint_field(uint8_t* out, size_t len, uint32_t field, uint64_t value) {
  uint64_t key = (uint64_t)field << 3 | PB_VARINT;
  do {
    out[len++] = (uint8_t)((key & 0x7f) | (key > 0x7f ? 0x80 : 0));
    key >>= 7;
  } while (key);
  do {
    out[len++] = (uint8_t)((value & 0x7f) | (value > 0x7f ? 0x80 : 0));
    value >>= 7;
  } while (value);
  return len;
}

/*
 * A ConfigProto that sets the two thread pools (0 = TensorFlow's own choice, as in config.proto)
 * and, when asked, per-session pools. 'out' holds at least 40 bytes; returns the length.
 */
static __attribute__((unused)) size_t tf_config_proto(uint8_t* out, uint32_t intra, uint32_t inter, bool per_session) {
  size_t len = 0;
  if (intra) len = pb_put_varint_field(out, len, CONFIG_INTRA_OP_THREADS, intra);
  if (inter) len = pb_put_varint_field(out, len, CONFIG_INTER_OP_THREADS, inter);
  if (per_session) len = pb_put_varint_field(out, len, CONFIG_PER_SESSION_THREADS, 1);
  return len;
}

#endif /* LAB_TF_PROTO_H */
