/* Weights from safetensors files (jit/shapejit.h, "Weights").
 *
 * The file is mapped read-only once. Its layout: an 8-byte little-endian
 * header length N, N bytes of JSON (parsed with jansson), then the data
 * section. Every entry is validated at open: a known or at least named
 * dtype, a shape of at most SJ_MAX_RANK non-negative sizes, data offsets
 * inside the data section matching the element count, no two entries'
 * bytes overlapping. A tensor asked for in its stored dtype on the CPU is
 * the mapping itself (an aligned copy when the offset is not aligned to
 * the element size); a conversion, or a device upload, is made once per
 * (name, dtype) and kept until close. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>
#include <uthash.h>

#include "base/error.h"
#include "base/half.h"
#include "jit/shapejit.h"

/* The largest JSON header accepted (the format's own limit is 100 MB). */
#define HEADER_MAX (UINT64_C(100) << 20)

typedef struct copy {
    struct copy *next;
    sj_dtype dtype;
    sj_tensor t; /* host copy (runtime's allocator) or device tensor */
} copy;

typedef struct wentry {
    UT_hash_handle hh;
    char *name;
    char stored[8];  /* the file's dtype name ("F32", "F64", ...) */
    int dtype;       /* sj_dtype, or -1 for a dtype shapejit lacks */
    int rank;
    int64_t shape[SJ_MAX_RANK];
    uint64_t begin, end; /* in the data section */
    copy *copies;
} wentry;

struct sj_weights {
    sj_runtime *rt;
    char *path;
    void *map;
    size_t map_len;
    const unsigned char *data; /* the data section */
    uint64_t data_len;
    wentry *by_name;           /* uthash */
    wentry **order;            /* file order of the header's keys */
    int n;
    pthread_mutex_t lock;      /* the copies */
};

static const struct {
    const char *name;
    int dtype;
    int bytes;
} DTYPES[] = {{"F32", SJ_F32, 4},  {"F16", SJ_F16, 2},  {"BF16", SJ_BF16, 2}, {"I32", SJ_I32, 4},
              {"I64", SJ_I64, 8},  {"BOOL", SJ_BOOL, 1}, {"F64", -1, 8},      {"I8", -1, 1},
              {"U8", -1, 1},       {"I16", -1, 2},      {"U16", -1, 2},      {"U32", -1, 4},
              {"U64", -1, 8},      {"F8_E4M3", -1, 1},  {"F8_E5M2", -1, 1}};

static int dtype_bytes(const char *name, int *dtype) {
    for (size_t i = 0; i < sizeof DTYPES / sizeof DTYPES[0]; i++)
        if (!strcmp(DTYPES[i].name, name)) {
            *dtype = DTYPES[i].dtype;
            return DTYPES[i].bytes;
        }
    return 0;
}

static int by_begin(const void *a, const void *b) {
    const wentry *x = *(wentry *const *)a, *y = *(wentry *const *)b;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
}

static void free_entries(sj_weights *w) {
    wentry *e, *tmp;
    HASH_ITER(hh, w->by_name, e, tmp) {
        HASH_DEL(w->by_name, e);
        for (copy *c = e->copies, *next; c; c = next) {
            next = c->next;
            sj_tensor_free(w->rt, &c->t);
            free(c);
        }
        free(e->name);
        free(e);
    }
}

void sj_weights_close(sj_weights *w) {
    if (!w) return;
    free_entries(w);
    free(w->order);
    if (w->map) munmap(w->map, w->map_len);
    pthread_mutex_destroy(&w->lock);
    free(w->path);
    free(w);
}

/* One header entry: validated into e (its name set by the caller). */
static sj_status parse_entry(const sj_weights *w, const char *name, json_t *v, wentry *e) {
    const char *p = w->path;
    if (!json_is_object(v)) return sj_seterr(SJ_EINVAL, "%s: tensor '%s': header entry is not an object", p, name);
    json_t *dt = json_object_get(v, "dtype"), *shape = json_object_get(v, "shape"),
           *offs = json_object_get(v, "data_offsets");
    if (!json_is_string(dt) || !json_is_array(shape) || !json_is_array(offs))
        return sj_seterr(SJ_EINVAL, "%s: tensor '%s': header entry lacks dtype, shape or data_offsets", p, name);
    int bytes = dtype_bytes(json_string_value(dt), &e->dtype);
    if (!bytes)
        return sj_seterr(SJ_EINVAL, "%s: tensor '%s': unknown dtype '%.16s'", p, name, json_string_value(dt));
    snprintf(e->stored, sizeof e->stored, "%s", json_string_value(dt));
    size_t rank = json_array_size(shape);
    if (rank > SJ_MAX_RANK)
        return sj_seterr(SJ_EINVAL, "%s: tensor '%s': rank %zu, more than %d", p, name, rank, SJ_MAX_RANK);
    e->rank = (int)rank;
    uint64_t numel = 1;
    for (size_t i = 0; i < rank; i++) {
        json_t *d = json_array_get(shape, i);
        if (!json_is_integer(d) || json_integer_value(d) < 0)
            return sj_seterr(SJ_EINVAL, "%s: tensor '%s': shape[%zu] is not a size", p, name, i);
        e->shape[i] = json_integer_value(d);
        if (e->shape[i] && numel > (UINT64_C(1) << 62) / (uint64_t)e->shape[i])
            return sj_seterr(SJ_EINVAL, "%s: tensor '%s': too many elements", p, name);
        numel *= (uint64_t)e->shape[i];
    }
    if (json_array_size(offs) != 2 || !json_is_integer(json_array_get(offs, 0)) ||
        !json_is_integer(json_array_get(offs, 1)) || json_integer_value(json_array_get(offs, 0)) < 0 ||
        json_integer_value(json_array_get(offs, 1)) < json_integer_value(json_array_get(offs, 0)))
        return sj_seterr(SJ_EINVAL, "%s: tensor '%s': data_offsets is not [begin, end]", p, name);
    e->begin = (uint64_t)json_integer_value(json_array_get(offs, 0));
    e->end = (uint64_t)json_integer_value(json_array_get(offs, 1));
    if (e->end > w->data_len)
        return sj_seterr(SJ_EINVAL,
                         "%s: tensor '%s': data [%" PRIu64 ", %" PRIu64 ") past the end of the data (%" PRIu64
                         " bytes): truncated file",
                         p, name, e->begin, e->end, w->data_len);
    if (e->end - e->begin != numel * (uint64_t)bytes)
        return sj_seterr(SJ_EINVAL,
                         "%s: tensor '%s': %" PRIu64 " bytes of data for %" PRIu64 " elements of %s", p, name,
                         e->end - e->begin, numel, e->stored);
    return SJ_OK;
}

sj_status sj_weights_open(sj_runtime *rt, const char *path, sj_weights **out) {
    sj_clearerr();
    if (!out) return sj_seterr(SJ_EINVAL, "sj_weights_open: w is NULL");
    *out = NULL;
    if (!rt || !path) return sj_seterr(SJ_EINVAL, "sj_weights_open: rt or path is NULL");
    sj_weights *w = calloc(1, sizeof *w);
    if (!w || !(w->path = strdup(path)) || pthread_mutex_init(&w->lock, NULL)) {
        if (w) free(w->path);
        free(w);
        return sj_seterr(SJ_ENOMEM, "sj_weights_open: out of memory");
    }
    w->rt = rt;
    sj_status st = SJ_OK;
    json_t *root = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb)) {
        st = sj_seterr(SJ_EINVAL, "%s: cannot open: %s", path, strerror(errno));
        goto fail;
    }
    if (!S_ISREG(sb.st_mode)) {
        st = sj_seterr(SJ_EINVAL, "%s: not a regular file", path);
        goto fail;
    }
    if (sb.st_size < 8) {
        st = sj_seterr(SJ_EINVAL, "%s: %lld bytes: truncated file (no header length)", path, (long long)sb.st_size);
        goto fail;
    }
    w->map_len = (size_t)sb.st_size;
    w->map = mmap(NULL, w->map_len, PROT_READ, MAP_PRIVATE, fd, 0);
    if (w->map == MAP_FAILED) {
        w->map = NULL;
        st = sj_seterr(SJ_ENOMEM, "%s: cannot map %zu bytes: %s", path, w->map_len, strerror(errno));
        goto fail;
    }
    const unsigned char *m = w->map;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | m[i];
    if (hlen > HEADER_MAX || hlen > (uint64_t)w->map_len - 8) {
        st = sj_seterr(SJ_EINVAL, "%s: header of %" PRIu64 " bytes out of bounds (file of %zu bytes)", path, hlen,
                       w->map_len);
        goto fail;
    }
    w->data = m + 8 + hlen;
    w->data_len = (uint64_t)w->map_len - 8 - hlen;
    json_error_t jerr;
    root = json_loadb((const char *)m + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &jerr);
    if (!root || !json_is_object(root)) {
        st = sj_seterr(SJ_EINVAL, "%s: header is not a JSON object: %s", path, root ? "another JSON value" : jerr.text);
        goto fail;
    }
    size_t n = json_object_size(root);
    if (!(w->order = calloc(n ? n : 1, sizeof *w->order))) {
        st = sj_seterr(SJ_ENOMEM, "%s: out of memory", path);
        goto fail;
    }
    const char *name;
    json_t *v;
    json_object_foreach(root, name, v) {
        if (!strcmp(name, "__metadata__")) {
            if (!json_is_object(v)) {
                st = sj_seterr(SJ_EINVAL, "%s: __metadata__ is not an object", path);
                goto fail;
            }
            continue;
        }
        wentry *e = calloc(1, sizeof *e);
        if (!e || !(e->name = strdup(name))) {
            free(e);
            st = sj_seterr(SJ_ENOMEM, "%s: out of memory", path);
            goto fail;
        }
        if ((st = parse_entry(w, name, v, e))) {
            free(e->name);
            free(e);
            goto fail;
        }
        HASH_ADD_KEYPTR(hh, w->by_name, e->name, strlen(e->name), e);
        w->order[w->n++] = e;
    }
    /* no two tensors share bytes */
    wentry **sorted = malloc((w->n ? w->n : 1) * sizeof *sorted);
    if (!sorted) {
        st = sj_seterr(SJ_ENOMEM, "%s: out of memory", path);
        goto fail;
    }
    memcpy(sorted, w->order, (size_t)w->n * sizeof *sorted);
    qsort(sorted, (size_t)w->n, sizeof *sorted, by_begin);
    for (int i = 1; i < w->n; i++)
        if (sorted[i]->begin < sorted[i - 1]->end && sorted[i]->begin < sorted[i]->end) {
            st = sj_seterr(SJ_EINVAL, "%s: tensors '%s' and '%s' have overlapping ranges", path, sorted[i - 1]->name,
                           sorted[i]->name);
            free(sorted);
            goto fail;
        }
    free(sorted);
    json_decref(root);
    close(fd);
    *out = w;
    return SJ_OK;
fail:
    json_decref(root);
    if (fd >= 0) close(fd);
    sj_weights_close(w);
    return st;
}

int sj_weights_count(const sj_weights *w) { return w ? w->n : 0; }

const char *sj_weights_name(const sj_weights *w, int i) {
    return w && i >= 0 && i < w->n ? w->order[i]->name : NULL;
}

static wentry *find(const sj_weights *w, const char *name) {
    wentry *e = NULL;
    HASH_FIND_STR(w->by_name, name, e);
    return e;
}

static sj_tensor stored_view(const sj_weights *w, const wentry *e) {
    sj_tensor t = sj_tensor_make((void *)(w->data + e->begin), e->dtype < 0 ? SJ_F32 : (sj_dtype)e->dtype, e->rank,
                                 e->shape);
    return t;
}

sj_status sj_weights_info(const sj_weights *w, const char *name, sj_tensor *desc) {
    sj_clearerr();
    if (!w || !name || !desc) return sj_seterr(SJ_EINVAL, "sj_weights_info: NULL argument");
    wentry *e = find(w, name);
    if (!e) return sj_seterr(SJ_EINVAL, "%s: no tensor '%s' in the file", w->path, name);
    if (e->dtype < 0)
        return sj_seterr(SJ_EDTYPE, "%s: tensor '%s': dtype %s is not one shapejit computes with", w->path, name,
                         e->stored);
    *desc = stored_view(w, e);
    return SJ_OK;
}

static double get_elem(const void *p, sj_dtype dt, int64_t i) {
    switch (dt) {
    case SJ_F32: {
        float f;
        memcpy(&f, (const char *)p + 4 * i, 4);
        return f;
    }
    case SJ_F16: {
        uint16_t h;
        memcpy(&h, (const char *)p + 2 * i, 2);
        return sj_f16_to_f32(h);
    }
    case SJ_BF16: {
        uint16_t h;
        memcpy(&h, (const char *)p + 2 * i, 2);
        return sj_bf16_to_f32(h);
    }
    default:
        return 0;
    }
}

static void put_elem(void *p, sj_dtype dt, int64_t i, double v) {
    if (dt == SJ_F32) {
        float f = (float)v;
        memcpy((char *)p + 4 * i, &f, 4);
    } else {
        uint16_t h = dt == SJ_F16 ? sj_f32_to_f16((float)v) : sj_f32_to_bf16((float)v);
        memcpy((char *)p + 2 * i, &h, 2);
    }
}

static bool is_float(int dt) { return dt == SJ_F32 || dt == SJ_F16 || dt == SJ_BF16; }

sj_status sj_weights_get(sj_weights *w, const char *name, sj_dtype dtype, int rank, const int64_t *shape,
                         sj_tensor *out) {
    sj_clearerr();
    if (!w || !name || !out) return sj_seterr(SJ_EINVAL, "sj_weights_get: NULL argument");
    wentry *e = find(w, name);
    if (!e) return sj_seterr(SJ_EINVAL, "%s: no tensor '%s' in the file", w->path, name);
    if (shape) {
        bool same = rank == e->rank;
        for (int i = 0; same && i < rank; i++) same = shape[i] == e->shape[i];
        if (!same) {
            char want[160] = "", have[160] = "";
            for (int i = 0; i < rank && i < SJ_MAX_RANK; i++)
                snprintf(want + strlen(want), sizeof want - strlen(want), "%s%" PRId64, i ? ", " : "", shape[i]);
            for (int i = 0; i < e->rank; i++)
                snprintf(have + strlen(have), sizeof have - strlen(have), "%s%" PRId64, i ? ", " : "", e->shape[i]);
            return sj_seterr(SJ_ESHAPE, "%s: tensor '%s': wrong shape: expected [%s], the file has [%s]", w->path,
                             name, want, have);
        }
    }
    if ((unsigned)dtype >= SJ_DTYPE_COUNT) return sj_seterr(SJ_EINVAL, "sj_weights_get: dtype %d", (int)dtype);
    if (e->dtype != (int)dtype && !(is_float(e->dtype) && is_float(dtype)))
        return sj_seterr(SJ_EDTYPE, "%s: tensor '%s': wrong dtype: the file has %s, asked for %s (only f32, f16 "
                                    "and bf16 convert)",
                         w->path, name, e->stored, sj_dtype_name(dtype));
    bool device = sj_runtime_backend(w->rt) == SJ_BACKEND_CUDA;
    sj_tensor view = stored_view(w, e);
    size_t es = sj_dtype_size(dtype);
    bool aligned = ((uintptr_t)view.data % es) == 0;
    if (!device && e->dtype == (int)dtype && aligned) {
        *out = view; /* zero-copy: the mapping */
        return SJ_OK;
    }
    pthread_mutex_lock(&w->lock);
    for (copy *c = e->copies; c; c = c->next)
        if (c->dtype == dtype) {
            *out = c->t;
            pthread_mutex_unlock(&w->lock);
            return SJ_OK;
        }
    sj_status st = SJ_OK;
    copy *c = calloc(1, sizeof *c);
    sj_tensor host = sj_tensor_make(NULL, dtype, e->rank, e->shape);
    if (!c || (st = sj_tensor_alloc(w->rt, &host))) {
        free(c);
        pthread_mutex_unlock(&w->lock);
        return st ? st : sj_seterr(SJ_ENOMEM, "%s: tensor '%s': out of memory", w->path, name);
    }
    int64_t n = sj_tensor_numel(&host);
    if (e->dtype == (int)dtype) memcpy(host.data, view.data, (size_t)n * es);
    else
        for (int64_t i = 0; i < n; i++) put_elem(host.data, dtype, i, get_elem(view.data, (sj_dtype)e->dtype, i));
    c->dtype = dtype;
    c->t = host;
    if (device) {
        sj_tensor dev = sj_tensor_make(NULL, dtype, e->rank, e->shape);
        dev.device = SJ_CUDA;
        if ((st = sj_tensor_alloc(w->rt, &dev)) || (st = sj_tensor_copy(w->rt, &dev, &host))) {
            sj_tensor_free(w->rt, &dev);
            sj_tensor_free(w->rt, &host);
            free(c);
            pthread_mutex_unlock(&w->lock);
            return st;
        }
        sj_tensor_free(w->rt, &host);
        c->t = dev;
    }
    c->next = e->copies;
    e->copies = c;
    *out = c->t;
    pthread_mutex_unlock(&w->lock);
    return SJ_OK;
}
