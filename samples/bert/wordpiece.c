/* wordpiece: the uncased BERT WordPiece tokenizer (see wordpiece.h).
 *
 * The steps and their rules are those of Hugging Face `tokenizers`
 * (BertNormalizer, BertPreTokenizer, WordPiece, the [CLS] A [SEP]
 * template), on Unicode code points decoded and classified with utf8proc:
 *
 *   clean      drop U+0000, U+FFFD and "other" characters (Cc, Cf, Cn, Co,
 *              Cs) except tab, newline and return; whitespace -> ' '
 *   CJK        a space on each side of every CJK ideograph
 *   accents    canonical decomposition (NFD), nonspacing marks (Mn) dropped
 *   lowercase  each character's own lowercase mapping (U+0130 becomes
 *              "i" + U+0307; no final-sigma context, as in `tokenizers`)
 *   split      on whitespace (dropped) and punctuation (each its own piece:
 *              ASCII punctuation and the Unicode P* categories)
 *   wordpiece  per word of at most 100 characters, the longest vocabulary
 *              prefix, then the longest "##" continuation, and so on; a
 *              word that cannot be covered is [UNK]
 *   template   [CLS] pieces [SEP], the pieces truncated to max_len - 2
 */
#include "samples/bert/wordpiece.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <uthash.h>
#include <utf8proc.h>

#define MAX_WORD_CHARS 100

typedef struct vocab_entry {
    UT_hash_handle hh;
    int32_t id;
    char text[]; /* NUL-terminated */
} vocab_entry;

struct wp_tokenizer {
    vocab_entry *by_text; /* uthash over text */
    vocab_entry **by_id;
    int n;
    int max_len;
    int32_t cls, sep, unk;
};

/* -- Vocabulary --------------------------------------------------------------- */

void wp_tokenizer_free(wp_tokenizer *tk) {
    if (!tk) return;
    HASH_CLEAR(hh, tk->by_text);
    for (int i = 0; i < tk->n; i++) free(tk->by_id[i]);
    free(tk->by_id);
    free(tk);
}

static int32_t lookup(const wp_tokenizer *tk, const char *s, size_t len) {
    vocab_entry *e = NULL;
    HASH_FIND(hh, tk->by_text, s, len, e);
    return e ? e->id : -1;
}

int32_t wp_token_id(const wp_tokenizer *tk, const char *token) {
    return tk && token ? lookup(tk, token, strlen(token)) : -1;
}

const char *wp_token(const wp_tokenizer *tk, int32_t id) {
    return tk && id >= 0 && id < tk->n ? tk->by_id[id]->text : NULL;
}

int wp_vocab_size(const wp_tokenizer *tk) { return tk ? tk->n : 0; }

int wp_tokenizer_load(const char *vocab_path, int max_len, wp_tokenizer **out, char *err, size_t err_len) {
    char dummy[1];
    if (!err) err = dummy, err_len = sizeof dummy;
    if (!out) {
        snprintf(err, err_len, "wp_tokenizer_load: out is NULL");
        return -1;
    }
    *out = NULL;
    if (!vocab_path || max_len < 2) {
        snprintf(err, err_len, "wp_tokenizer_load: %s", vocab_path ? "max_len below 2" : "no vocabulary path");
        return -1;
    }
    FILE *f = fopen(vocab_path, "r");
    if (!f) {
        snprintf(err, err_len, "%s: %s", vocab_path, strerror(errno));
        return -1;
    }
    wp_tokenizer *tk = calloc(1, sizeof *tk);
    int cap = 0;
    char line[1024];
    bool oom = !tk;
    while (!oom && fgets(line, sizeof line, f)) {
        size_t len = strcspn(line, "\r\n");
        line[len] = 0;
        if (tk->n == cap) {
            cap = cap ? 2 * cap : 32768;
            vocab_entry **v = realloc(tk->by_id, (size_t)cap * sizeof *v);
            if (!v) {
                oom = true;
                break;
            }
            tk->by_id = v;
        }
        vocab_entry *e = malloc(sizeof *e + len + 1);
        if (!e) {
            oom = true;
            break;
        }
        e->id = tk->n;
        memcpy(e->text, line, len + 1);
        tk->by_id[tk->n++] = e;
        vocab_entry *old = NULL;
        HASH_FIND(hh, tk->by_text, e->text, len, old);
        if (!old) HASH_ADD_KEYPTR(hh, tk->by_text, e->text, len, e); /* the first id of a duplicate wins */
    }
    fclose(f);
    if (oom) {
        snprintf(err, err_len, "%s: out of memory", vocab_path);
        wp_tokenizer_free(tk);
        return -1;
    }
    tk->max_len = max_len;
    tk->cls = wp_token_id(tk, "[CLS]");
    tk->sep = wp_token_id(tk, "[SEP]");
    tk->unk = wp_token_id(tk, "[UNK]");
    if (tk->cls < 0 || tk->sep < 0 || tk->unk < 0) {
        snprintf(err, err_len, "%s: the vocabulary (%d tokens) lacks %s", vocab_path, tk->n,
                 tk->cls < 0 ? "[CLS]" : tk->sep < 0 ? "[SEP]" : "[UNK]");
        wp_tokenizer_free(tk);
        return -1;
    }
    *out = tk;
    return 0;
}

/* -- Character classes ------------------------------------------------------ */

static bool is_whitespace(int32_t c) {
    /* tab, newline, return, and Unicode's White_Space property */
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

static bool is_control(int32_t c) {
    if (c == '\t' || c == '\n' || c == '\r') return false;
    utf8proc_category_t k = utf8proc_category(c);
    return k == UTF8PROC_CATEGORY_CC || k == UTF8PROC_CATEGORY_CF || k == UTF8PROC_CATEGORY_CN ||
           k == UTF8PROC_CATEGORY_CO || k == UTF8PROC_CATEGORY_CS;
}

static bool is_cjk(int32_t c) {
    return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
           (c >= 0x2A700 && c <= 0x2B73F) || (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
           (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

static bool is_punct(int32_t c) {
    if ((c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) || (c >= 123 && c <= 126)) return true;
    utf8proc_category_t k = utf8proc_category(c);
    return k >= UTF8PROC_CATEGORY_PC && k <= UTF8PROC_CATEGORY_PO;
}

/* -- Encoding ------------------------------------------------------------------ */

typedef struct cps {
    int32_t *v;
    size_t n, cap;
} cps;

static bool push(cps *a, int32_t c) {
    if (a->n == a->cap) {
        size_t cap = a->cap ? 2 * a->cap : 256;
        int32_t *v = realloc(a->v, cap * sizeof *v);
        if (!v) return false;
        a->v = v, a->cap = cap;
    }
    a->v[a->n++] = c;
    return true;
}

/* The normalizer: text -> code points (clean, CJK, accents, lowercase).
 * false: invalid UTF-8 or out of memory (*bad says which). */
static bool normalize(const char *text, size_t len, cps *out, bool *bad) {
    cps a = {0};
    *bad = false;
    const utf8proc_uint8_t *p = (const utf8proc_uint8_t *)text;
    size_t i = 0;
    bool ok = true;
    while (ok && i < len) {
        utf8proc_int32_t c;
        utf8proc_ssize_t k = utf8proc_iterate(p + i, (utf8proc_ssize_t)(len - i), &c);
        if (k <= 0 || c < 0) {
            *bad = true;
            ok = false;
            break;
        }
        i += (size_t)k;
        if (c == 0 || c == 0xFFFD || is_control(c)) continue;
        if (is_whitespace(c)) c = ' ';
        if (is_cjk(c)) {
            ok = push(&a, ' ') && push(&a, c) && push(&a, ' ');
            continue;
        }
        /* accents: NFD, nonspacing marks dropped */
        utf8proc_int32_t d[32];
        int last;
        utf8proc_ssize_t nd = utf8proc_decompose_char(c, d, 32, UTF8PROC_DECOMPOSE, &last);
        if (nd < 0 || nd > 32) nd = 1, d[0] = c;
        for (utf8proc_ssize_t j = 0; ok && j < nd; j++)
            if (utf8proc_category(d[j]) != UTF8PROC_CATEGORY_MN) ok = push(&a, d[j]);
    }
    if (!ok) {
        free(a.v);
        return false;
    }
    /* lowercase, character by character (as `tokenizers` does: no final
     * sigma), with the one full mapping that is not one to one */
    for (size_t j = 0; j < a.n && ok; j++) {
        int32_t c = a.v[j];
        if (c == 0x0130) {
            ok = push(out, 'i') && push(out, 0x0307);
        } else {
            ok = push(out, utf8proc_tolower(c));
        }
    }
    free(a.v);
    return ok;
}

/* UTF-8 of cp[from, to) into buf (with room for 4 bytes a code point);
 * returns the length. */
static size_t to_utf8(const int32_t *cp, size_t from, size_t to, char *buf) {
    size_t n = 0;
    for (size_t i = from; i < to; i++) n += (size_t)utf8proc_encode_char(cp[i], (utf8proc_uint8_t *)buf + n);
    return n;
}

typedef struct emit {
    int32_t *ids;
    int cap;
    int count;     /* pieces so far (all of them, kept or not) */
    int keep;      /* the most pieces kept: max_len - 2 */
} emit;

static void put(emit *e, int32_t id) {
    if (e->count < e->keep && e->count + 1 < e->cap) e->ids[e->count + 1] = id; /* after [CLS] */
    e->count++;
}

/* WordPiece over one word cp[from, to); buf holds its UTF-8 with "##". */
static void word_pieces(const wp_tokenizer *tk, const int32_t *cp, size_t from, size_t to, char *buf, emit *e) {
    if (to - from > MAX_WORD_CHARS) {
        put(e, tk->unk);
        return;
    }
    int32_t found[MAX_WORD_CHARS];
    int n = 0;
    size_t start = from;
    while (start < to) {
        int32_t id = -1;
        size_t end = to;
        for (; end > start; end--) {
            size_t len = 0;
            if (start > from) buf[0] = '#', buf[1] = '#', len = 2;
            len += to_utf8(cp, start, end, buf + len);
            if ((id = lookup(tk, buf, len)) >= 0) break;
        }
        if (id < 0) {
            put(e, tk->unk);
            return;
        }
        found[n++] = id;
        start = end;
    }
    for (int i = 0; i < n; i++) put(e, found[i]);
}

int wp_encode(const wp_tokenizer *tk, const char *text, size_t len, int32_t *ids, int cap) {
    if (!tk || (!text && len) || (!ids && cap > 0) || cap < 0) return -1;
    cps cp = {0};
    bool bad;
    if (!normalize(text ? text : "", len, &cp, &bad)) return -1;
    char *buf = malloc(4 * (MAX_WORD_CHARS + 1) + 3);
    if (!buf) {
        free(cp.v);
        return -1;
    }
    emit e = {ids, cap, 0, tk->max_len - 2};
    size_t i = 0;
    while (i < cp.n) {
        if (is_whitespace(cp.v[i])) {
            i++;
            continue;
        }
        if (is_punct(cp.v[i])) {
            word_pieces(tk, cp.v, i, i + 1, buf, &e);
            i++;
            continue;
        }
        size_t j = i;
        while (j < cp.n && !is_whitespace(cp.v[j]) && !is_punct(cp.v[j])) j++;
        word_pieces(tk, cp.v, i, j, buf, &e);
        i = j;
    }
    free(buf);
    free(cp.v);
    int kept = e.count < e.keep ? e.count : e.keep;
    int total = kept + 2;
    if (cap > 0) ids[0] = tk->cls;
    if (kept + 1 < cap) ids[kept + 1] = tk->sep;
    return total;
}
