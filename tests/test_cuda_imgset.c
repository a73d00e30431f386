/* The CUDA backend's image sets (kernels/cuda/imgset.h): the artifact of a
 * unit compiled as several NVRTC programs, or to PTX. No GPU needed; a
 * build without CUDA prints "skipped: built without CUDA".
 *   a round trip of two CUBINs and a PTX: images, kinds, bytes, 16-byte
 *   offsets; a single CUBIN stored as itself and read as a set of one;
 *   refusals (what the backend then treats as a cache miss): junk, a short
 *   ELF, no images or too many, a truncated set, a length past the end, a
 *   CUBIN that is not an ELF, a PTX without its NUL, an unknown kind.
 */
/* clang-format off */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
/* clang-format on */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef SJ_WITH_CUDA
#include "kernels/cuda/imgset.h"

static char elf_a[200], elf_b[77], ptx[11];

static int setup(void **state) {
    (void)state;
    memset(elf_a, 0xa5, sizeof elf_a);
    memcpy(elf_a, "\x7f" "ELF", 4);
    memset(elf_b, 0x5a, sizeof elf_b);
    memcpy(elf_b, "\x7f" "ELF", 4);
    memcpy(ptx, ".version 9", 11); /* with its NUL */
    return 0;
}

static void test_round_trip(void **state) {
    (void)state;
    const sj_img in[3] = {{elf_a, sizeof elf_a, SJ_IMG_CUBIN}, {ptx, sizeof ptx, SJ_IMG_PTX},
                          {elf_b, sizeof elf_b, SJ_IMG_CUBIN}};
    size_t len = 0;
    char *a = sj_imgset_make(in, 3, &len);
    assert_non_null(a);
    assert_memory_equal(a, "SJCUIMG1\x03\0\0\0", 12);
    sj_img out[SJ_IMGSET_MAX];
    char err[128];
    assert_int_equal(sj_imgset_parse(a, len, out, err, sizeof err), 3);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(out[i].kind, in[i].kind);
        assert_int_equal(out[i].len, in[i].len);
        assert_memory_equal(out[i].data, in[i].data, in[i].len);
        assert_int_equal((out[i].data - a) % 16, 0);
    }
    free(a);

    a = sj_imgset_make(in, 1, &len); /* one CUBIN: itself */
    assert_non_null(a);
    assert_int_equal(len, sizeof elf_a);
    assert_memory_equal(a, elf_a, len);
    assert_int_equal(sj_imgset_parse(a, len, out, err, sizeof err), 1);
    assert_ptr_equal(out[0].data, a);
    assert_int_equal(out[0].len, len);
    free(a);

    a = sj_imgset_make(&in[1], 1, &len); /* one PTX: a set */
    assert_non_null(a);
    assert_int_equal(sj_imgset_parse(a, len, out, err, sizeof err), 1);
    assert_int_equal(out[0].kind, SJ_IMG_PTX);
    assert_string_equal(out[0].data, ".version 9");
    free(a);
}

/* parse of buf must fail, saying `why` (line: the caller's) */
static void refused_at(const void *buf, size_t len, const char *why, int line) {
    sj_img out[SJ_IMGSET_MAX];
    char err[128] = "";
    if (sj_imgset_parse(buf, len, out, err, sizeof err) != 0) fail_msg("line %d: accepted (expected: %s)", line, why);
    if (!strstr(err, why)) fail_msg("line %d: '%s' does not say '%s'", line, err, why);
}
#define refused(buf, len, why) refused_at((buf), (len), (why), __LINE__)

static void test_refusals(void **state) {
    (void)state;
    refused("junk", 4, "not a CUBIN (4 bytes, no ELF header) nor an image set");
    refused(elf_a, 63, "not a CUBIN (63 bytes"); /* an ELF header needs 64 */
    const sj_img in[2] = {{elf_a, sizeof elf_a, SJ_IMG_CUBIN}, {ptx, sizeof ptx, SJ_IMG_PTX}};
    size_t len;
    char *a = sj_imgset_make(in, 2, &len);
    assert_non_null(a);
    char *b = malloc(len);
    assert_non_null(b);
    uint32_t n;
    uint64_t bytes;

    memcpy(b, a, len), n = 0, memcpy(b + 8, &n, 4);
    refused(b, len, "nor an image set");
    memcpy(b, a, len), n = SJ_IMGSET_MAX + 1, memcpy(b + 8, &n, 4);
    refused(b, len, "nor an image set");
    refused(a, 16 + 2 * 16 - 1, "a malformed image set"); /* the table cut */
    refused(a, len - 16, "a malformed image set");        /* the PTX cut */
    memcpy(b, a, len), bytes = len, memcpy(b + 16 + 8, &bytes, 8);
    refused(b, len, "a malformed image set"); /* past the end */
    memcpy(b, a, len), b[16 + 2 * 16] = 'X';
    refused(b, len, "a malformed image set"); /* the CUBIN is no ELF */
    memcpy(b, a, len), bytes = sizeof ptx - 1, memcpy(b + 16 + 16 + 8, &bytes, 8);
    refused(b, len, "a malformed image set"); /* the PTX without its NUL */
    memcpy(b, a, len), n = 2, memcpy(b + 16 + 16, &n, 4);
    refused(b, len, "a malformed image set"); /* an unknown kind */
    memcpy(b, a, len);
    sj_img out[SJ_IMGSET_MAX];
    char err[128];
    assert_int_equal(sj_imgset_parse(b, len, out, err, sizeof err), 2); /* untouched: fine */
    free(a);
    free(b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
#else
int main(void) {
    printf("skipped: built without CUDA (no SJ_WITH_CUDA)\n");
    return 0;
}
#endif
