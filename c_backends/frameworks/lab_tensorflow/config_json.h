/*
 * config_json.h - read the tensors of a model config (Triton hands it over as JSON) in plain C.
 *
 * lab_backend_util.h finds a parameter or a top-level number with a substring search, which is
 * enough for one value; a framework backend needs the config's input and output lists: each
 * tensor's name, data_type and dims. This is a small scanner for that compact JSON (the model
 * config as core serializes it, TRITONBACKEND_ModelConfig version 1): it walks objects and arrays
 * by nesting depth, skipping strings, so a name inside a nested object is never taken for a member.
 * int64 fields such as dims arrive as strings ("dims":["64"], protobuf's JSON mapping): both
 * forms are accepted.
 */
#ifndef LAB_CONFIG_JSON_H
#define LAB_CONFIG_JSON_H

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Past the JSON string starting at 'p' (on its opening quote); NULL if it never ends. */
static const char* json_skip_string(const char* p) {
  for (++p; *p; ++p) {
    if (*p == '\\' && p[1]) ++p;
    else if (*p == '"') return p + 1;
  }
  return NULL;
}

/* Past the value starting at 'p' (string, object, array, number or literal); NULL if malformed. */
static const char* json_skip_value(const char* p) {
  if (*p == '"') return json_skip_string(p);
  if (*p == '{' || *p == '[') {
    int depth = 0;
    while (*p) {
      if (*p == '"') {
        p = json_skip_string(p);
        if (p == NULL) return NULL;
        continue;
      }
      if (*p == '{' || *p == '[') ++depth;
      if (*p == '}' || *p == ']') {
        if (--depth == 0) return p + 1;
      }
      ++p;
    }
    return NULL;
  }
  while (*p && *p != ',' && *p != '}' && *p != ']') ++p;
  return p;
}

/* The value of member 'key' of the object starting at 'object' (on its '{'), or NULL. */
static const char* json_member(const char* object, const char* key) {
  if (object == NULL || *object != '{') return NULL;
  size_t key_len = strlen(key);
  const char* p = object + 1;
  while (*p == ' ' || *p == ',') ++p;
  while (*p == '"') {
    const char* name_end = json_skip_string(p);
    if (name_end == NULL || *name_end != ':') return NULL;
    const char* value = name_end + 1;
    if ((size_t)(name_end - p - 2) == key_len && memcmp(p + 1, key, key_len) == 0) return value;
    p = json_skip_value(value);
    if (p == NULL) return NULL;
    while (*p == ' ' || *p == ',') ++p;
  }
  return NULL;
}

/* Copy the string value at 'value' into 'out'; false if it is not a string or does not fit. */
static bool json_string(const char* value, char* out, size_t out_size) {
  if (value == NULL || *value != '"') return false;
  const char* end = json_skip_string(value);
  if (end == NULL || (size_t)(end - value - 2) >= out_size) return false;
  memcpy(out, value + 1, (size_t)(end - value - 2));
  out[end - value - 2] = '\0';
  return true;
}

/* The 'index'-th element of the array at 'value' (on its '['), or NULL; *count gets the length. */
static const char* json_element(const char* value, size_t index, size_t* count) {
  *count = 0;
  if (value == NULL || *value != '[') return NULL;
  const char* found = NULL;
  const char* p = value + 1;
  while (*p && *p != ']') {
    while (*p == ' ' || *p == ',') ++p;
    if (*p == ']') break;
    if (*count == index) found = p;
    ++*count;
    p = json_skip_value(p);
    if (p == NULL) return NULL;
  }
  return found;
}

/* An integer element, written as a number or (int64) as a string of digits. */
static bool json_int(const char* value, int64_t* out) {
  if (value == NULL) return false;
  if (*value == '"') ++value;
  char* end = NULL;
  long long v = strtoll(value, &end, 10);
  if (end == value) return false;
  *out = (int64_t)v;
  return true;
}

#endif /* LAB_CONFIG_JSON_H */
