/* Image sets: the CUDA backend's cached artifact for a unit compiled as
 * several NVRTC programs, or to PTX (kernels/cuda/backend_cuda.c). Plain
 * bytes, no CUDA: a header, then each image at a multiple of 16 bytes (the
 * cache hands back malloc'd, 16-byte aligned buffers: so are the images).
 *
 *   "SJCUIMG1"  magic (8 bytes)
 *   u32 n       images (1 .. SJ_IMGSET_MAX)
 *   u32 0
 *   n x {u32 kind (SJ_IMG_CUBIN, SJ_IMG_PTX), u32 0, u64 bytes}
 *   images      (PTX with its terminating NUL)
 *
 * Host byte order (the cache's key covers the machine's backend). A unit
 * compiled as one program to a CUBIN is stored as that CUBIN: an ELF image
 * reads as a set of one. */
#ifndef SJ_CUDA_IMGSET_H
#define SJ_CUDA_IMGSET_H

#include <stddef.h>
#include <stdint.h>

/* The most images a set holds: the CUDA backend splits a unit into at
 * most this many programs (backend_cuda.c asserts that the generator's
 * SJ_IMGSET_MAX fits). */
#define SJ_IMGSET_MAX 16

enum { SJ_IMG_CUBIN = 0, SJ_IMG_PTX = 1 };

typedef struct sj_img {
    const char *data;
    size_t len;
    uint32_t kind; /* SJ_IMG_CUBIN or SJ_IMG_PTX */
} sj_img;

/* One artifact of n images (1 .. SJ_IMGSET_MAX; malloc'd, *len): a
 * copy of the image when it is a single CUBIN, else a set. NULL when out
 * of memory. */
char *sj_imgset_make(const sj_img *im, int n, size_t *len);

/* The images of the artifact buf (len bytes) into im[] (room for
 * SJ_IMGSET_MAX; pointing into buf); their count. 0 with why in err
 * when it is neither an ELF image (64 bytes at least) nor a well-formed
 * set: every image inside buf, each CUBIN an ELF, each PTX NUL-terminated
 * (the driver reads no length). */
int sj_imgset_parse(const void *buf, size_t len, sj_img *im, char *err, size_t errn);

#endif
