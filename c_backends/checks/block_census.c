/*
 * block_census.c - counts the blocks a backend under check still holds: not a backend, a checker's tool.
 *
 * Notebook 09c's checker (lab_backends/lessons/native_exercise.py) links this file into the learner's
 * build of lab_tensorflow with the linker's --wrap for the calls that allocate and free: TF_AllocateTensor,
 * TF_NewTensor and TF_DeleteTensor, malloc, calloc, realloc, aligned_alloc, posix_memalign and free.
 * --wrap renames only the calls made by the objects of that link (the learner's file and the rest of
 * the backend), so what libtensorflow or Triton allocate for themselves is not counted. Each block a
 * wrapped call returns is remembered by its address; a wrapped free or delete of a remembered address
 * forgets it (a free of anything else, e.g. TF_DeleteTensor on the output TF_SessionRun made, changes
 * nothing). The number remembered is written to a file the checker reads at any moment, an 8-byte
 * counter in a shared mapping of LAB_CENSUS_FILE (a path the checker compiles in), so nothing is
 * parsed from the server's log and no call on the hot path does I/O.
 *
 * Why not the server's RSS, which the checker read before: a leak's first hundreds of blocks can land
 * in memory the allocator already held, free, so its growth over a window depended on the heap's history
 * (a per-request TF_Tensor never deleted grew it 2.3 MB where it leaked 6.6 MB, and passed, once in 2
 * audits). Counting addresses gives the same number on every run.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "tensorflow/c/c_api.h"

#ifndef LAB_CENSUS_FILE
#error "compile with -DLAB_CENSUS_FILE=\"<path>\": the file the checker reads"
#endif

/* Open addressing, a power of two; a leak of one block per request fills a few hundred slots. When
 * full, new blocks are not remembered, and the counter says FULL: more than any correct answer holds. */
#define SLOTS (1u << 16)
#define FULL UINT64_MAX
static const uintptr_t kGone = 1; /* a tombstone: never a block's address */

static uintptr_t slots[SLOTS];
static uint64_t live;
static volatile uint64_t* counter; /* the shared mapping, or NULL when it could not be made */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t opened = PTHREAD_ONCE_INIT;

static void open_counter(void) {
  int fd = open(LAB_CENSUS_FILE, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return;
  if (ftruncate(fd, sizeof(uint64_t)) == 0) {
    void* at = mmap(NULL, sizeof(uint64_t), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (at != MAP_FAILED) counter = at;
  }
  close(fd);
}

static uint32_t slot_of(uintptr_t address) { return (uint32_t)((address >> 4) * 2654435761u) & (SLOTS - 1); }

static void remember(const void* block) {
  if (block == NULL) return;
  pthread_once(&opened, open_counter);
  pthread_mutex_lock(&lock);
  uint32_t i = slot_of((uintptr_t)block);
  for (uint32_t n = 0; n < SLOTS; ++n, i = (i + 1) & (SLOTS - 1)) {
    if (slots[i] == 0 || slots[i] == kGone) {
      slots[i] = (uintptr_t)block;
      ++live;
      break;
    }
  }
  if (counter != NULL) *counter = live < SLOTS - 1 ? live : FULL;
  pthread_mutex_unlock(&lock);
}

static void forget(const void* block) {
  if (block == NULL) return;
  pthread_mutex_lock(&lock);
  uint32_t i = slot_of((uintptr_t)block);
  for (uint32_t n = 0; n < SLOTS && slots[i] != 0; ++n, i = (i + 1) & (SLOTS - 1)) {
    if (slots[i] == (uintptr_t)block) {
      slots[i] = kGone;
      --live;
      if (counter != NULL) *counter = live;
      break;
    }
  }
  pthread_mutex_unlock(&lock);
}

/* The real functions, as the linker's --wrap names them. */
TF_Tensor* __real_TF_AllocateTensor(TF_DataType, const int64_t*, int, size_t);
TF_Tensor* __real_TF_NewTensor(TF_DataType, const int64_t*, int, void*, size_t,
                               void (*)(void*, size_t, void*), void*);
void __real_TF_DeleteTensor(TF_Tensor*);
void* __real_malloc(size_t);
void* __real_calloc(size_t, size_t);
void* __real_realloc(void*, size_t);
void* __real_aligned_alloc(size_t, size_t);
int __real_posix_memalign(void**, size_t, size_t);
void __real_free(void*);

TF_Tensor* __wrap_TF_AllocateTensor(TF_DataType type, const int64_t* dims, int num_dims, size_t len) {
  TF_Tensor* tensor = __real_TF_AllocateTensor(type, dims, num_dims, len);
  remember(tensor);
  return tensor;
}

TF_Tensor* __wrap_TF_NewTensor(TF_DataType type, const int64_t* dims, int num_dims, void* data, size_t len,
                               void (*deallocator)(void*, size_t, void*), void* arg) {
  TF_Tensor* tensor = __real_TF_NewTensor(type, dims, num_dims, data, len, deallocator, arg);
  remember(tensor);
  return tensor;
}

void __wrap_TF_DeleteTensor(TF_Tensor* tensor) {
  forget(tensor);
  __real_TF_DeleteTensor(tensor);
}

void* __wrap_malloc(size_t size) {
  void* block = __real_malloc(size);
  remember(block);
  return block;
}

void* __wrap_calloc(size_t count, size_t size) {
  void* block = __real_calloc(count, size);
  remember(block);
  return block;
}

void* __wrap_realloc(void* old, size_t size) {
  void* block = __real_realloc(old, size);
  if (block != NULL || size == 0) forget(old); /* moved or freed; a failed realloc keeps the old block */
  remember(block);
  return block;
}

void* __wrap_aligned_alloc(size_t alignment, size_t size) {
  void* block = __real_aligned_alloc(alignment, size);
  remember(block);
  return block;
}

int __wrap_posix_memalign(void** block, size_t alignment, size_t size) {
  int err = __real_posix_memalign(block, alignment, size);
  if (err == 0) remember(*block);
  return err;
}

void __wrap_free(void* block) {
  forget(block);
  __real_free(block);
}
