/* shapejit-cache: portable kernel bundles on the command line (the library's
 * kernels/bundle.h).
 *
 *   shapejit-cache export DIR FILE   every verified kernel of cache DIR into FILE
 *   shapejit-cache list FILE         the kernels of a bundle (verified when a key is given)
 *   shapejit-cache verify FILE       check a bundle's signature and structure
 *   shapejit-cache import FILE DIR   verify FILE, then store its kernels into cache DIR
 *
 * The key is SHAPEJIT_CACHE_KEY (read with secure_getenv), or the contents of
 * the file named by --key-file PATH (one line; a trailing newline is
 * dropped): never an argument, which other users could read in the process
 * list. Exit status: 0 done, 1 refused or failed (the message says why),
 * 2 bad usage.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "jit/shapejit.h"
#include "kernels/bundle.h"

#define KEY_MAX 4096

static const char usage_text[] =
    "usage: shapejit-cache [--key-file PATH] COMMAND ARGS\n"
    "  export DIR FILE   every kernel of cache DIR that verifies under the key, into bundle FILE\n"
    "  list FILE         the kernels of bundle FILE (its signature checked when a key is given)\n"
    "  verify FILE       check bundle FILE's signature and structure\n"
    "  import FILE DIR   verify bundle FILE, then store its kernels into cache DIR\n"
    "The key: SHAPEJIT_CACHE_KEY, or the file given with --key-file (the cache key of the\n"
    "runtimes that wrote and will read the caches).\n";

static int usage(const char *why) {
    if (why) fprintf(stderr, "shapejit-cache: %s\n", why);
    fputs(usage_text, stderr);
    return 2;
}

static int failed(const char *what) {
    fprintf(stderr, "shapejit-cache: %s\n", what);
    return 1;
}

/* The key from --key-file (into buf) or the environment; NULL if none. */
static const char *read_key(const char *key_file, char *buf, size_t n, int *bad) {
    *bad = 0;
    if (!key_file) {
        const char *k = secure_getenv("SHAPEJIT_CACHE_KEY");
        return k && *k ? k : NULL;
    }
    int fd = open(key_file, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) || !S_ISREG(st.st_mode)) {
        fprintf(stderr, "shapejit-cache: cannot read the key file %s: %s\n", key_file,
                fd < 0 ? strerror(errno) : "not a regular file");
        if (fd >= 0) close(fd);
        *bad = 1;
        return NULL;
    }
    ssize_t got = read(fd, buf, n - 1);
    close(fd);
    if (got < 0) got = 0;
    buf[got] = '\0';
    buf[strcspn(buf, "\r\n")] = '\0';
    if (!buf[0]) {
        fprintf(stderr, "shapejit-cache: the key file %s is empty\n", key_file);
        *bad = 1;
        return NULL;
    }
    return buf;
}

static int cmd_export(const char *dir, const char *file, const char *key) {
    if (!key) return failed("export: no key (set SHAPEJIT_CACHE_KEY or give --key-file): a bundle is signed with it");
    int n = 0, refused = 0;
    if (sj_bundle_export(dir, key, file, &n, &refused)) return failed(sj_last_error());
    printf("exported %d kernel%s from %s to %s", n, n == 1 ? "" : "s", dir, file);
    if (refused) printf(" (%d refused: not verifying under this key)", refused);
    printf("\n");
    return 0;
}

static int cmd_list(const char *file, const char *key, bool list) {
    if (!list && !key) return failed("verify: no key (set SHAPEJIT_CACHE_KEY or give --key-file)");
    sj_bundle *b = NULL;
    if (sj_bundle_read(file, key, &b)) return failed(sj_last_error());
    unsigned long long bytes = 0;
    for (int i = 0; i < sj_bundle_count(b); i++) {
        const sj_bundle_entry *e = sj_bundle_entry_at(b, i);
        if (list) printf("%s.%s %zu\n", e->key, e->ext, e->len);
        bytes += e->len;
    }
    printf("%s: %d kernel%s, %llu bytes; %s\n", file, sj_bundle_count(b), sj_bundle_count(b) == 1 ? "" : "s", bytes,
           sj_bundle_verified(b) ? "signature verified" : "signature not checked (no key)");
    sj_bundle_free(b);
    return 0;
}

static int cmd_import(const char *file, const char *dir, const char *key) {
    if (!key) return failed("import: no key (set SHAPEJIT_CACHE_KEY or give --key-file): the bundle must be verified");
    sj_bundle *b = NULL;
    if (sj_bundle_read(file, key, &b)) return failed(sj_last_error());
    int n = 0;
    sj_status st = sj_bundle_import(b, dir, key, &n);
    int count = sj_bundle_count(b);
    sj_bundle_free(b);
    if (st) return failed(sj_last_error());
    printf("imported %d of %d kernel%s into %s\n", n, count, count == 1 ? "" : "s", dir);
    return 0;
}

int main(int argc, char **argv) {
    const char *key_file = NULL;
    int i = 1;
    if (i < argc && (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help"))) {
        fputs(usage_text, stdout);
        return 0;
    }
    if (i < argc && !strcmp(argv[i], "--key-file")) {
        if (i + 1 >= argc) return usage("--key-file needs a path");
        key_file = argv[i + 1];
        i += 2;
    }
    if (i >= argc) return usage("no command");
    const char *cmd = argv[i++];
    int nargs = argc - i;
    int want = !strcmp(cmd, "export") || !strcmp(cmd, "import") ? 2 : !strcmp(cmd, "list") || !strcmp(cmd, "verify") ? 1 : -1;
    if (want < 0) {
        char msg[128];
        snprintf(msg, sizeof msg, "unknown command '%.64s'", cmd);
        return usage(msg);
    }
    if (nargs != want) {
        char msg[128];
        snprintf(msg, sizeof msg, "%s takes %d argument%s, got %d", cmd, want, want == 1 ? "" : "s", nargs);
        return usage(msg);
    }
    char buf[KEY_MAX];
    int bad;
    const char *key = read_key(key_file, buf, sizeof buf, &bad);
    if (bad) return 1;
    if (!strcmp(cmd, "export")) return cmd_export(argv[i], argv[i + 1], key);
    if (!strcmp(cmd, "import")) return cmd_import(argv[i], argv[i + 1], key);
    return cmd_list(argv[i], key, !strcmp(cmd, "list"));
}
