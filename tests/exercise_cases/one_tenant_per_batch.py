"""Audit cases of ``one_tenant_per_batch`` (notebook 09b): the learner's batching strategy in C.

The reference is the strategy's own file, c_backends/batching/tenant_batching/tenant_batching.c (its
batches; request_tenant and the batcher's two functions are c_backends/include/tenant_batching.h, which
every answer includes). Each wrong answer is the reference with one fault put in (written to a scratch
folder that lives as long as the process); the checks that catch them read the source, build it, or
serve it.
"""

from lab_backends.lessons.exercises import batch_strategy
from lab_backends.lessons.exercises.audit import SourceVariants, Wrong
from lab_backends.lessons.exercises.registry import load_solution

REFERENCE = load_solution("one_tenant_per_batch").read_text()
_SOURCES = SourceVariants(REFERENCE, "tenant")
_file, _variant = _SOURCES.file, _SOURCES.variant

FREE_BOTH = "    free(batch->tenant);\n    free(batch);\n"
COMPARE = "*should_include = batch->tenant != NULL && strcmp(batch->tenant, tenant) == 0;"
COPY = "    batch->tenant = strdup(tenant);\n"
KEEP = "    batch->tenant = (char*)tenant; /* the request's own text, no copy */\n"

WRONG = [
    Wrong("ModelBatchFinalize frees the batch but not its copy of the tenant",
          _variant("leaks_tenant", (FREE_BOTH, "    free(batch);\n")),
          r"allocates ->tenant, which TRITONBACKEND_ModelBatchFinalize never frees"),
    Wrong("ModelBatchFinalize frees nothing",
          _variant("leaks_batch", (FREE_BOTH, "    (void)batch;\n")),
          r"ModelBatchFinalize frees nothing.*every batch leaks it"),
    Wrong("ignores the tenant: every request joins (the plain batcher)",
          _variant("ignores_tenant", (COMPARE, "*should_include = true;")),
          r"mixed tenants.*it refused none of the \d+ requests of another tenant"),
    Wrong("compares only as many characters as the batch's tenant has ('red' takes 'redwood')",
          _variant("prefix", (COMPARE, "*should_include = batch->tenant != NULL && "
                                       "strncmp(batch->tenant, tenant, strlen(batch->tenant)) == 0;")),
          r"mixed tenants.*every tenant it let in begins with the batch's.*a comparison of only as many characters"),
    Wrong("copies the tenant but compares the pointers, not the text: no two requests ever share a batch",
          _variant("pointers", (COMPARE, "*should_include = batch->tenant == tenant;")),
          r"refused \d+ of the \d+ requests offered to a batch of their own tenant.*"
          r"Compare tenant names with strcmp, not their pointers"),
    # The issue-47 answer: the request's pointer kept (the header says to copy it) and compared with ==;
    # tenant-less requests still meet, since request_tenant gives them all one "" literal.
    Wrong("keeps the request's pointer and compares pointers: only tenant-less requests share a batch",
          _variant("kept_pointer_compared", (COPY, KEEP), (COMPARE, "*should_include = batch->tenant == tenant;"),
                   (FREE_BOTH, "    free(batch);\n")),
          r"only tenant-less requests shared a batch.*the same pointer.*"
          r"Compare tenant names with strcmp, not their pointers"),
    Wrong("keeps the request's pointer and frees it in ModelBatchFinalize as if it were a copy",
          _variant("kept_pointer_freed", (COPY, KEEP)),
          # bad-free when the request's text is still in a heap block, SEGV when its memory is already gone
          # (both seen on the learner's path of one audit): either way the learner's free, at its line
          r"AddressSanitizer found a (bad-free|SEGV) .*in TRITONBACKEND_ModelBatchFinalize\(\) at \w+\.c:\d+.*"
          r"free only what your strategy allocated \(the request's tenant text is the request's\)"),
    # A copy one byte short (no room for the terminating NUL): the write lands in malloc's padding or the
    # next block, so nothing need crash; AddressSanitizer stops the server at strcpy's write, with the line.
    Wrong("copies the tenant into malloc(strlen(tenant)) bytes: strcpy writes its '\\0' past the block",
          _variant("copy_one_short", (COPY, "    batch->tenant = malloc(strlen(tenant));\n"
                                            "    if (batch->tenant != NULL) strcpy(batch->tenant, tenant);\n")),
          r"AddressSanitizer found a heap-buffer-overflow \(WRITE of size \d+: .*"
          r"in TRITONBACKEND_ModelBatchIncludeRequest\(\) at \w+\.c:\d+.*strlen \+ 1 bytes"),
    Wrong("tests strcmp's result as true-when-equal: includes other tenants, refuses its own",
          _variant("strcmp_as_bool", (COMPARE, "*should_include = batch->tenant != NULL && "
                                               "strcmp(batch->tenant, tenant);")),
          r"wrong way round.*strcmp returns 0 when the texts are equal"),
    Wrong("refuses a request without a tenant, even as the first of a batch: the batcher spins",
          _variant("refuses_untagged",
                   ("  LAB_RETURN_IF_ERROR(request_tenant(request, &tenant));\n",
                    "  LAB_RETURN_IF_ERROR(request_tenant(request, &tenant));\n"
                    "  if (tenant[0] == '\\0') {\n    *should_include = false;\n    return NULL;\n  }\n")),
          r"never answered .*Always include a batch's first request"),
    Wrong("compares with the batch's tenant before the first request gave it one: strcmp(NULL, tenant)",
          _variant("compares_before_copy", ("  if (batch->requests == 0) {\n    batch->tenant = strdup(tenant);",
                                            "  *should_include = strcmp(batch->tenant, tenant) == 0 || "
                                            "batch->requests == 0;\n"
                                            "  if (batch->requests == 0) {\n    batch->tenant = strdup(tenant);")),
          r"AddressSanitizer found a SEGV .* at \w+\.c:\d+.*Check every pointer before use"),
    Wrong("an unused variable (a warning, so -Werror fails the build)",
          _variant("warning", ("  Batch* batch = userp;\n  if (batch != NULL) {",
                               "  Batch* batch = userp;\n  int unused = 0;\n  if (batch != NULL) {")),
          r"does not build.*unused variable"),
]

_HEADER = batch_strategy.SKELETON.read_text().split("*/", 1)[0] + "*/\n"

ALTERNATIVES = [
    # The skeleton's header comment, TODO(exercise) marks and all, kept above a finished file.
    _file("with_header", _HEADER + REFERENCE),
    # The tenant kept in a fixed buffer inside the batch (no second allocation), freed with the batch
    # by a helper; an over-long tenant is compared by its first 127 characters and a flag.
    _variant(
        "fixed_buffer",
        ("  char* tenant;      /* a copy of the first request's tenant (ours: freed in ModelBatchFinalize) */",
         "  char tenant[128];  /* the first request's tenant, cut at 127 characters */\n  bool long_tenant;"),
        ("    batch->tenant = strdup(tenant);\n    batch->requests = 1;\n"
         "    if (batch->tenant == NULL) {\n"
         '      return lab_errorf(TRITONSERVER_ERROR_INTERNAL, "%s: out of memory for a tenant", STRATEGY);\n'
         "    }\n    return NULL;",
         "    snprintf(batch->tenant, sizeof batch->tenant, \"%s\", tenant);\n"
         "    batch->long_tenant = strlen(tenant) >= sizeof batch->tenant;\n"
         "    batch->requests = 1;\n    return NULL;"),
        (COMPARE, "*should_include = !batch->long_tenant && strcmp(batch->tenant, tenant) == 0;"),
        ("TRITONSERVER_Error* TRITONBACKEND_ModelBatchFinalize(void* userp) {\n  Batch* batch = userp;\n"
         "  if (batch != NULL) {\n" + FREE_BOTH + "  }\n",
         "static void drop_batch(Batch* batch) { free(batch); }\n\n"
         "TRITONSERVER_Error* TRITONBACKEND_ModelBatchFinalize(void* userp) {\n  drop_batch(userp);\n"),
    ),
]
