/* The call path: sj_call.
 *
 *   check arguments -> signature of the inputs (on the stack) -> one hash ->
 *   memo lookup under a read lock -> (miss: trace under the trace lock) ->
 *   execute the entry's graph with no lock held.
 *
 * A warm hit allocates nothing: the signature lives on the stack and the
 * execution arena comes from the function's pool.
 */
#include <stdlib.h>
#include <string.h>

#include "jit/error.h"
#include "jit/exec.h"
#include "jit/fn.h"
#include "jit/tensor.h"
#include "jit/trace.h"

#define RELAXED memory_order_relaxed

/* -- Signatures -------------------------------------------------------------- */

static int pack_sig(const sj_tensor *in, int n, int64_t *sig) {
    int w = 0;
    for (int i = 0; i < n; i++) {
        const sj_tensor *x = &in[i];
        sig[w++] = (int64_t)x->dtype | (int64_t)x->rank << 8 | (int64_t)x->device << 16;
        for (int a = 0; a < x->rank; a++) sig[w++] = x->shape[a];
        for (int a = 0; a < x->rank; a++) sig[w++] = x->stride[a];
    }
    return w;
}

/* A fast 64-bit mix over the words, folded to uthash's 32 bits. */
static unsigned sig_hash(const int64_t *sig, int n) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (uint64_t)n;
    for (int i = 0; i < n; i++) {
        h ^= (uint64_t)sig[i];
        h *= 0xBF58476D1CE4E5B9ull;
        h ^= h >> 31;
    }
    return (unsigned)(h ^ (h >> 32));
}

static sj_entry *memo_find(sj_fn *fn, const int64_t *sig, int words, unsigned h) {
    sj_memo *m = NULL;
    pthread_rwlock_rdlock(&fn->memo_lock);
    HASH_FIND_BYHASHVALUE(hh, fn->memo, sig, (unsigned)(words * sizeof(int64_t)), h, m);
    pthread_rwlock_unlock(&fn->memo_lock);
    return m ? m->entry : NULL;
}

/* -- Argument checks ---------------------------------------------------------- */

static sj_status check_args(const sj_fn *fn, const sj_tensor *inputs, int n_inputs, const sj_tensor *outputs,
                            int n_outputs) {
    if (n_inputs != fn->n_inputs)
        return sj_seterr(SJ_EINVAL, "fn '%s': called with %d inputs, expected %d", fn->name, n_inputs, fn->n_inputs);
    if (n_inputs > 0 && !inputs) return sj_seterr(SJ_EINVAL, "fn '%s': inputs is NULL", fn->name);
    if (n_outputs < 0 || n_outputs > SJ_MAX_OUTPUTS)
        return sj_seterr(SJ_EINVAL, "fn '%s': n_outputs %d out of range [0, %d]", fn->name, n_outputs, SJ_MAX_OUTPUTS);
    if (n_outputs > 0 && !outputs) return sj_seterr(SJ_EINVAL, "fn '%s': outputs is NULL", fn->name);
    for (int i = 0; i < n_inputs; i++) {
        char what[32];
        snprintf(what, sizeof what, "input %d", i);
        sj_status st = sj_tensor_check(&inputs[i], what);
        if (st) {
            sj_err_prefix("fn '%s': ", fn->name);
            return st;
        }
        if (inputs[i].device != SJ_HOST)
            return sj_seterr(SJ_EINVAL, "fn '%s': input %d is device memory; the %s backend takes host memory",
                             fn->name, i, "CPU");
    }
    return SJ_OK;
}

/* -- Tracing a new signature -------------------------------------------------- */

static sj_status trace_entry(sj_fn *fn, const sj_tensor *inputs, const int64_t *sig, int words, unsigned h,
                             sj_entry **out) {
    pthread_mutex_lock(&fn->trace_lock);
    sj_entry *e = memo_find(fn, sig, words, h); /* another thread may have traced it */
    if (e) {
        pthread_mutex_unlock(&fn->trace_lock);
        *out = e;
        return SJ_OK;
    }
    sj_trace_req req = {.fn_name = fn->name, .model = fn->model, .user = fn->user, .inputs = inputs,
                        .n_inputs = fn->n_inputs};
    sj_trace_result res;
    sj_status st = sj_trace(&req, &res);
    if (st) {
        atomic_fetch_add_explicit(&fn->c.trace_errors, 1, RELAXED);
        pthread_mutex_unlock(&fn->trace_lock);
        return st;
    }
    free(res.facts); /* every size is a constant: nothing to guard beyond the signature */

    size_t key_bytes = (size_t)words * sizeof(int64_t);
    e = calloc(1, sizeof *e);
    sj_memo *m = malloc(sizeof *m + key_bytes);
    int64_t *sig_copy = malloc(key_bytes ? key_bytes : 1);
    if (!e || !m || !sig_copy) {
        free(e);
        free(m);
        free(sig_copy);
        sj_graph_destroy(res.graph);
        pthread_mutex_unlock(&fn->trace_lock);
        return sj_seterr(SJ_ENOMEM, "fn '%s': out of memory adding an entry", fn->name);
    }
    memcpy(sig_copy, sig, key_bytes);
    memcpy(m->key, sig, key_bytes);
    e->g = res.graph;
    e->sig = sig_copy;
    e->sig_words = words;
    e->id = fn->n_entries++;
    e->next = atomic_load_explicit(&fn->entries, RELAXED);
    m->entry = e;
    atomic_fetch_add_explicit(&fn->c.traces, 1, RELAXED);
    if (sj_log_on(fn->rt, SJ_LOG_TRACE)) {
        sj_logf(fn->rt, SJ_LOG_TRACE, "fn '%s': traced entry %d: %d nodes", fn->name, e->id, e->g->n_nodes);
    }

    atomic_store_explicit(&fn->entries, e, memory_order_release);
    pthread_rwlock_wrlock(&fn->memo_lock);
    HASH_ADD_KEYPTR_BYHASHVALUE(hh, fn->memo, m->key, (unsigned)key_bytes, h, m);
    pthread_rwlock_unlock(&fn->memo_lock);
    pthread_mutex_unlock(&fn->trace_lock);
    *out = e;
    return SJ_OK;
}

/* -- sj_call ------------------------------------------------------------------ */

sj_status sj_call(sj_fn *fn, const sj_tensor *inputs, int n_inputs, sj_tensor *outputs, int n_outputs) {
    sj_clearerr();
    if (!fn) return sj_seterr(SJ_EINVAL, "sj_call: fn is NULL");
    sj_status st = check_args(fn, inputs, n_inputs, outputs, n_outputs);
    if (st) goto fail;

    int64_t sig[SJ_SIG_WORDS_MAX];
    int words = pack_sig(inputs, n_inputs, sig);
    unsigned h = sig_hash(sig, words);
    sj_entry *e = memo_find(fn, sig, words, h);
    if (e) {
        atomic_fetch_add_explicit(&fn->c.memo_hits, 1, RELAXED);
    } else {
        st = trace_entry(fn, inputs, sig, words, h, &e);
        if (st) goto fail;
    }

    if (e->g->n_outputs != n_outputs) {
        st = sj_seterr(SJ_EINVAL, "fn '%s': called with %d outputs, the model produces %d", fn->name, n_outputs,
                       e->g->n_outputs);
        goto fail;
    }
    sj_exec x = {.rt = fn->rt, .g = e->g, .fn_name = fn->name, .inputs = inputs, .outputs = outputs,
                 .pool = &fn->pool, .arena_hint = &e->arena_hint};
    st = sj_exec_eager(&x);
    if (st) goto fail;
    atomic_fetch_add_explicit(&e->calls, 1, RELAXED);
    atomic_fetch_add_explicit(&fn->c.calls, 1, RELAXED);
    atomic_fetch_add_explicit(&fn->c.eager_calls, 1, RELAXED);
    return SJ_OK;

fail:
    if (fn) atomic_fetch_add_explicit(&fn->c.errors, 1, RELAXED);
    return st;
}
