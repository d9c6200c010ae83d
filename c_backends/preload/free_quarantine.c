/*
 * free_quarantine.c - preloaded into tritonserver (LD_PRELOAD): every thread's frees wait in a ring
 * of RING blocks before they reach the allocator.
 *
 * Not a backend: a workaround for a defect of the server binary we cannot rebuild. Triton 2.51's
 * TraceManager::TraceRelease (server src/tracer.cc:737-753 at r24.10) locks the mutex inside a
 * Trace with a std::lock_guard, then may drop the last reference to that Trace (`delete ts`, :749):
 * the Trace is freed with its mutex, and the guard unlocks the freed mutex when it goes out of scope.
 * pthread_mutex_unlock writes three of its fields (__lock, __owner, __nusers): bytes 16-28 of freed memory.
 * If another thread was already handed that memory, its data is corrupted: stop 43's CI lost a traced
 * server to heap corruption ("corrupted size vs. prev_size"). Fixed upstream by server 25baa7b (#8144,
 * first in v2.57.0), which moves the reference out and unlocks before releasing it.
 *
 * Why a ring: in TraceRelease, between the free of the Trace and the unlock, the same thread frees
 * two more blocks (the shared_ptr's control block, then `ts` itself) and nothing else. With each
 * thread's last RING frees held back, the Trace's memory is still ours when the unlock writes into
 * it, and no thread can have been handed it. The ring is per thread (no lock on the free path); a
 * thread's held blocks are released when it exits. Memory cost: at most RING blocks per thread.
 *
 * With LAB_FREE_QUARANTINE_CHECK set, each held block's first SNAP bytes are copied when it is freed
 * and compared when it leaves the ring: a difference is a write after free, reported on stderr (the
 * server's log) as one line. tests/reliability/test_trace_release_write.py reads those lines to pin
 * the defect: the day an upgrade fixes it, they stop.
 *
 * Build: lab_backends.server.free_quarantine.build(); set-up builds it into
 * build/preload/libfree_quarantine.so.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))
/* Preloaded at start-up, so its thread-local ring sits in the static TLS block: initial-exec reaches it
 * without __tls_get_addr, which may itself allocate. */
#define THREAD_LOCAL __thread __attribute__((tls_model("initial-exec")))

/* TraceRelease needs 3 (the Trace, its control block, ts); 16 leaves room for what a future libstdc++ adds. */
#define RING 16
/* The check compares this much of each block: the Trace's mutex is at bytes 16-55. */
#define SNAP 256
/* Reports past this many are counted, not printed: the log stays readable. */
#define MAX_REPORTS 20

typedef struct {
  void* block;
  size_t compared; /* bytes in copy (check mode only) */
  unsigned char copy[SNAP];
} Held;

static THREAD_LOCAL Held ring[RING];
static THREAD_LOCAL unsigned next_slot;

/* The free we defer to: the next one after us in the link order (glibc's, unless another allocator is
 * preloaded after us). Until our constructor has found it, glibc's own. */
extern void __libc_free(void* block);
static void (*release)(void*) = __libc_free;
static bool checking;
static pthread_key_t exit_key;
static bool started; /* the constructor has run: exit_key exists */
static atomic_ulong writes_after_free;

/* Compare a held block with its copy: any byte changed since its free was written after it. */
static void check_untouched(const Held* held) {
  const unsigned char* bytes = held->block;
  size_t first = held->compared, last = 0;
  for (size_t i = 0; i < held->compared; ++i) {
    if (bytes[i] != held->copy[i]) {
      if (first == held->compared) first = i;
      last = i;
    }
  }
  if (first == held->compared) return;
  if (atomic_fetch_add(&writes_after_free, 1) >= MAX_REPORTS) return;
  char line[160];
  int length = snprintf(line, sizeof line, "free_quarantine: pid %d: a freed %zu-byte block was written "
                        "after free, at bytes %zu-%zu\n", (int)getpid(), malloc_usable_size(held->block),
                        first, last);
  if (length > 0 && write(STDERR_FILENO, line, (size_t)length) < 0) return; /* nowhere else to say it */
}

/* Hand a held block to the allocator, checking it first in check mode. */
static void release_held(Held* held) {
  if (held->block == NULL) return;
  if (checking) check_untouched(held);
  release(held->block);
  held->block = NULL;
}

/* A thread that exits hands back what it holds (pthread_key_create's destructor runs at its exit). */
static void release_ring(void* unused) {
  (void)unused;
  for (unsigned i = 0; i < RING; ++i) release_held(&ring[i]);
}

EXPORT void free(void* block) {
  if (block == NULL) return;
  Held* held = &ring[next_slot];
  next_slot = (next_slot + 1) % RING;
  if (held->block == NULL && started) {
    /* This thread's first pass through its ring: arm the exit hook (a static key: no allocation). */
    pthread_setspecific(exit_key, ring);
  }
  release_held(held);
  held->block = block;
  if (checking) {
    size_t size = malloc_usable_size(block);
    held->compared = size < SNAP ? size : SNAP;
    memcpy(held->copy, block, held->compared);
  }
}

__attribute__((constructor)) static void start(void) {
  void (*next)(void*) = (void (*)(void*))dlsym(RTLD_NEXT, "free");
  if (next != NULL) release = next;
  checking = getenv("LAB_FREE_QUARANTINE_CHECK") != NULL;
  started = pthread_key_create(&exit_key, release_ring) == 0;
}

__attribute__((destructor)) static void finish(void) {
  unsigned long seen = atomic_load(&writes_after_free);
  if (!checking || seen <= MAX_REPORTS) return;
  char line[120];
  int length = snprintf(line, sizeof line, "free_quarantine: pid %d: %lu writes after free in all\n",
                        (int)getpid(), seen);
  if (length > 0 && write(STDERR_FILENO, line, (size_t)length) < 0) return;
}
