/* Per-thread scratch memory for the eager kernels.
 *
 * Each thread owns SJ_CPU_SCRATCH_SLOTS buffers, found through a
 * _Thread_local pointer. A buffer grows (to at least double its size) when
 * a caller asks for more than it holds and is otherwise reused as it is;
 * its contents are not kept across a growth. A pthread key whose
 * destructor frees the buffers is set on the thread's first use, so they
 * are released when the thread exits. No locks: nothing is shared.
 */
#include <assert.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#include "base/alloc.h"
#include "kernels/cpu/eager.h"

#define ALIGN 64

typedef struct scratch {
    void *p[SJ_CPU_SCRATCH_SLOTS];
    size_t cap[SJ_CPU_SCRATCH_SLOTS];
} scratch;

static _Thread_local scratch *tls;
static pthread_key_t key;
static pthread_once_t key_once = PTHREAD_ONCE_INIT;
static int key_ok;

/* Thread exit: free this thread's buffers. */
static void scratch_free(void *arg) {
    scratch *s = arg;
    for (int i = 0; i < SJ_CPU_SCRATCH_SLOTS; i++) free(s->p[i]);
    free(s);
    tls = NULL; /* a later use during this thread's exit starts over */
}

static void key_init(void) { key_ok = pthread_key_create(&key, scratch_free) == 0; }

void *sj_cpu_scratch(int slot, size_t bytes) {
    assert(slot >= 0 && slot < SJ_CPU_SCRATCH_SLOTS);
    scratch *s = tls;
    if (!s) {
        pthread_once(&key_once, key_init);
        s = sj_calloc(1, sizeof *s);
        if (!s)
            return NULL;
        /* without the key the buffers live until the process exits */
        if (key_ok)
            (void)pthread_setspecific(key, s);
        tls = s;
    }
    if (bytes <= s->cap[slot] && s->p[slot])
        return s->p[slot];
    if (bytes > SIZE_MAX / 2 - ALIGN)
        return NULL;
    size_t cap = s->cap[slot] * 2;
    cap = cap < bytes ? bytes : cap;
    cap = (cap + ALIGN - 1) / ALIGN * ALIGN;
    cap = cap ? cap : ALIGN;
    void *p = sj_aligned_alloc(ALIGN, cap);
    if (!p)
        return NULL;
    free(s->p[slot]);
    s->p[slot] = p;
    s->cap[slot] = cap;
    return p;
}
