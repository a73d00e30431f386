/* Image sets (see imgset.h). */
#include "kernels/cuda/imgset.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAGIC "SJCUIMG1"

static size_t align16(size_t n) { return (n + 15) & ~(size_t)15; }

static int bad(size_t len, char *err, size_t errn) {
    snprintf(err, errn, "a malformed image set (%zu bytes)", len);
    return 0;
}

int sj_imgset_parse(const void *buf, size_t len, sj_img *im, char *err, size_t errn) {
    const unsigned char *b = buf;
    if (len >= 64 && !memcmp(b, "\x7f" "ELF", 4)) {
        im[0] = (sj_img){(const char *)b, len, SJ_IMG_CUBIN};
        return 1;
    }
    uint32_t n = 0;
    if (len >= 16 && !memcmp(b, MAGIC, 8)) memcpy(&n, b + 8, 4);
    if (n < 1 || n > SJ_IMGSET_MAX) {
        snprintf(err, errn, "not a CUBIN (%zu bytes, no ELF header) nor an image set", len);
        return 0;
    }
    size_t at = 16 + (size_t)n * 16;
    if (at > len) return bad(len, err, errn);
    for (uint32_t i = 0; i < n; i++) {
        uint32_t kind;
        uint64_t bytes;
        memcpy(&kind, b + 16 + i * 16, 4);
        memcpy(&bytes, b + 16 + i * 16 + 8, 8);
        if (at > len || bytes > len - at || kind > SJ_IMG_PTX) return bad(len, err, errn);
        const unsigned char *d = b + at;
        if (kind == SJ_IMG_CUBIN ? bytes < 64 || memcmp(d, "\x7f" "ELF", 4) : !bytes || d[bytes - 1])
            return bad(len, err, errn);
        im[i] = (sj_img){(const char *)d, (size_t)bytes, kind};
        at += align16((size_t)bytes);
    }
    return (int)n;
}

char *sj_imgset_make(const sj_img *im, int n, size_t *len) {
    if (n == 1 && im[0].kind == SJ_IMG_CUBIN) {
        char *o = malloc(im[0].len);
        if (o) memcpy(o, im[0].data, im[0].len);
        *len = im[0].len;
        return o;
    }
    size_t total = 16 + (size_t)n * 16;
    for (int i = 0; i < n; i++) total += align16(im[i].len);
    char *o = calloc(1, total);
    if (!o) return NULL;
    memcpy(o, MAGIC, 8);
    uint32_t un = (uint32_t)n;
    memcpy(o + 8, &un, 4);
    size_t at = 16 + (size_t)n * 16;
    for (int i = 0; i < n; i++) {
        uint64_t bytes = im[i].len;
        memcpy(o + 16 + i * 16, &im[i].kind, 4);
        memcpy(o + 16 + i * 16 + 8, &bytes, 8);
        memcpy(o + at, im[i].data, im[i].len);
        at += align16(im[i].len);
    }
    *len = total;
    return o;
}
