"""Audit cases of ``clip_backend`` (notebook 09): the learner's C backend ``clip``.

The reference is the backend's own file, c_backends/clip/clip.c (the four functions the exercise asks
for; the rest, Execute included, is c_backends/include/clip_backend.h, which every answer includes).
Each wrong answer is the reference with one fault put in (written to a scratch folder that lives
as long as the process); the checks that catch them read the source, build, or serve it.
"""

from lab_backends.lessons import c_lab
from lab_backends.lessons.exercises.audit import SourceVariants, Wrong
from lab_backends.lessons.exercises.registry import load_solution

REFERENCE = load_solution("clip_backend").read_text()
_SOURCES = SourceVariants(REFERENCE, "clip")
_file, _variant = _SOURCES.file, _SOURCES.variant
LOOP = "    for (uint64_t k = 0; k < input.elements; ++k) out[k] = fminf(fmaxf(data[k], bounds->lo), bounds->hi);"

SEND_FAILED = ('LAB_LOG(TRITONSERVER_LOG_ERROR, "%s: send failed: %s", BACKEND, TRITONSERVER_ErrorMessage(err));\n'
               '    TRITONSERVER_ErrorDelete(err);\n    return false;')

WRONG = [
    Wrong("accepts lo > hi", _variant("no_order", ("if (bounds.lo > bounds.hi) {", "if (0) {")),
          r"lo > hi loaded"),
    Wrong("ModelFinalize never frees the state",
          _variant("leaks_state", ("  free(state);\n  return NULL;\n}", "  (void)state;\n  return NULL;\n}")),
          r"ModelFinalize does not free"),
    Wrong("*items = 1 for every request",
          _variant("items_one", ("*items = input.dims > 0 ? (uint64_t)input.shape[0] : 1;", "*items = 1;")),
          r"set \*items to the request's first dimension"),
    Wrong("deletes a response after sending it",
          _variant("double_free", (SEND_FAILED, SEND_FAILED.replace(
              "return false;", "TRITONBACKEND_ResponseDelete(response);\n    return false;"))),
          r"ResponseDelete.*Triton's"),
    Wrong("never frees the error of a failed send",
          _variant("leaks_error", (SEND_FAILED, SEND_FAILED.replace("TRITONSERVER_ErrorDelete(err);\n    ", ""))),
          r"never passed to TRITONSERVER_ErrorDelete"),
    Wrong("clamps only from below",
          _variant("half_clamp", ("fminf(fmaxf(data[k], bounds->lo), bounds->hi)", "fmaxf(data[k], bounds->lo)")),
          r"came back as"),
    # Memory errors a learner writes (issue 47), named by AddressSanitizer with the line of the file.
    Wrong("asks for an output buffer of one row and writes every row into it",
          _variant("one_row_buffer", ("(void**)&out, input.byte_size, &mem", "(void**)&out, input.byte_size / "
                                      "(uint64_t)input.shape[0], &mem")),
          r"AddressSanitizer found a heap-buffer-overflow \(WRITE of size 4.*\) in [\w_]+\(\) at [\w.-]+\.c:\d+"),
    Wrong("frees the copy of the input before clamping it",
          _variant("freed_before_use", (LOOP, "    free(data);\n" + LOOP), ("  }\n  free(data);\n", "  }\n")),
          r"AddressSanitizer found a heap-use-after-free \(READ of size 4.*\) in [\w_]+\(\) at [\w.-]+\.c:\d+"),
    Wrong("an unused variable (a warning, so -Werror fails the build)",
          _variant("warning", ("  float* out = NULL;\n", "  float* out = NULL;\n  int unused = 0;\n")),
          r"does not build.*unused variable"),
]

_HEADER = c_lab.SKELETON.read_text().split("*/", 1)[0] + "*/\n"

ALTERNATIVES = [
    # The skeleton's header comment, TODO(exercise) marks and all, kept above a finished file.
    _file("with_header", _HEADER + REFERENCE),
    # Frees through a helper of its own and logs-and-frees the send error through another.
    _variant(
        "helpers",
        ("TRITONSERVER_Error* TRITONBACKEND_ModelFinalize(",
         "static void release_bounds(void* state) { free(state); }\n\n"
         "static void drop_error(TRITONSERVER_Error* error) {\n"
         '  LAB_LOG(TRITONSERVER_LOG_ERROR, "%s: %s", BACKEND, TRITONSERVER_ErrorMessage(error));\n'
         "  TRITONSERVER_ErrorDelete(error);\n}\n\n"
         "TRITONSERVER_Error* TRITONBACKEND_ModelFinalize("),
        ("  free(state);\n  return NULL;\n}", "  release_bounds(state);\n  return NULL;\n}"),
        (SEND_FAILED, "drop_error(err);\n    return false;"),
    ),
    # Clamps with comparisons instead of fminf/fmaxf (NaN was refused before: no third case).
    _variant("comparisons", (LOOP, "    for (uint64_t k = 0; k < input.elements; ++k) {\n"
                                   "      float x = data[k];\n"
                                   "      out[k] = x < bounds->lo ? bounds->lo : x > bounds->hi ? bounds->hi : x;\n"
                                   "    }")),
]
