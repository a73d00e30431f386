/* wordpiece: the uncased BERT WordPiece tokenizer (see wordpiece.h).
 *
 * One pass over the text, no allocation: each code point goes through the
 * BertNormalizer steps (clean text, CJK padding, NFD + drop Mn, lowercase)
 * and the BertPreTokenizer split as it is read, into a word buffer on the
 * stack; a finished word is matched greedily against the vocabulary (an
 * open-addressing hash table built at load) and its ids written out. The
 * tokenizer is read only after load, so any number of threads may encode
 * with it at once.
 *
 * As in Hugging Face `tokenizers`, the special tokens [PAD] [UNK] [CLS]
 * [SEP] [MASK] (those the vocabulary holds) written literally in the raw
 * text are matched before normalization and become their own ids. */
#include "samples/bert/wordpiece.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

/* Hugging Face's max_input_chars_per_word: a longer word becomes [UNK]. */
#define WP_MAX_WORD_CHARS 100
/* Room for the word buffer: the limit plus one (to know it was passed). */
#define WP_WORD_CAP (WP_MAX_WORD_CHARS + 1)

static const char *const special_names[] = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"};
#define N_SPECIAL ((int)(sizeof special_names / sizeof special_names[0]))

struct wp_tokenizer {
    char *pool;       /* every token, NUL-terminated, in id order */
    uint32_t *offs;   /* id -> offset of its token in pool */
    uint32_t *lens;   /* id -> byte length */
    int32_t *slots;   /* hash table of ids, -1 empty; nslots a power of 2 */
    uint32_t nslots;
    int n;            /* vocabulary size */
    int max_len;
    int32_t unk, cls, sep;
    int32_t special_id[N_SPECIAL]; /* -1 where the vocabulary lacks it */
};

/* -- Vocabulary ------------------------------------------------------------ */

static uint32_t hash_bytes(const char *s, size_t n) {
    uint32_t h = 2166136261u; /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 16777619u;
    return h;
}

static int32_t lookup(const wp_tokenizer *tk, const char *s, size_t n) {
    uint32_t mask = tk->nslots - 1;
    for (uint32_t i = hash_bytes(s, n) & mask;; i = (i + 1) & mask) {
        int32_t id = tk->slots[i];
        if (id < 0) return -1;
        if (tk->lens[id] == n && memcmp(tk->pool + tk->offs[id], s, n) == 0) return id;
    }
}

static void seterr(char *err, size_t err_len, const char *fmt, const char *path, const char *what) {
    if (err && err_len) snprintf(err, err_len, fmt, path, what);
}

int wp_tokenizer_load(const char *vocab_path, int max_len, wp_tokenizer **out, char *err,
                      size_t err_len) {
    if (out) *out = NULL;
    if (!vocab_path || !out || max_len < 2) {
        seterr(err, err_len, "%s%s", "wp_tokenizer_load: ",
               !vocab_path || !out ? "NULL argument" : "max_len must be at least 2");
        return -1;
    }
    FILE *f = fopen(vocab_path, "rb");
    if (!f) {
        seterr(err, err_len, "%s: %s", vocab_path, strerror(errno));
        return -1;
    }
    wp_tokenizer *tk = calloc(1, sizeof *tk);
    long size = -1;
    if (tk && fseek(f, 0, SEEK_END) == 0 && (size = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0)
        tk->pool = malloc((size_t)size + 2);
    if (!tk || !tk->pool || fread(tk->pool, 1, (size_t)size, f) != (size_t)size) {
        fclose(f);
        seterr(err, err_len, "%s: %s", vocab_path, tk && tk->pool ? "read error" : "out of memory");
        wp_tokenizer_free(tk);
        return -1;
    }
    fclose(f);
    char *p = tk->pool, *end = p + size;
    if (size > 0 && end[-1] != '\n') *end++ = '\n'; /* a last line without newline */
    *end = '\0';
    /* one token per line: ids are line numbers; \n -> NUL, a \r before it dropped */
    int n = 0;
    for (char *q = p; q < end; q++) n += *q == '\n';
    if (n == 0 || (size_t)size > UINT32_MAX - 2) {
        seterr(err, err_len, "%s: %s", vocab_path, n == 0 ? "empty vocabulary" : "too large");
        wp_tokenizer_free(tk);
        return -1;
    }
    tk->n = n;
    tk->max_len = max_len;
    tk->offs = malloc((size_t)n * sizeof *tk->offs);
    tk->lens = malloc((size_t)n * sizeof *tk->lens);
    tk->nslots = 16;
    while (tk->nslots < (uint32_t)n * 2) tk->nslots *= 2;
    tk->slots = malloc((size_t)tk->nslots * sizeof *tk->slots);
    if (!tk->offs || !tk->lens || !tk->slots) {
        seterr(err, err_len, "%s: %s", vocab_path, "out of memory");
        wp_tokenizer_free(tk);
        return -1;
    }
    memset(tk->slots, 0xff, (size_t)tk->nslots * sizeof *tk->slots);
    uint32_t mask = tk->nslots - 1;
    char *line = p;
    for (int id = 0; id < n; id++) {
        char *nl = memchr(line, '\n', (size_t)(end - line));
        *nl = '\0';
        size_t len = (size_t)(nl - line);
        if (len && line[len - 1] == '\r') line[--len] = '\0';
        tk->offs[id] = (uint32_t)(line - p);
        tk->lens[id] = (uint32_t)len;
        /* a token seen twice keeps its last id, as Hugging Face's vocab map */
        uint32_t i = hash_bytes(line, len) & mask;
        while (tk->slots[i] >= 0 &&
               !(tk->lens[tk->slots[i]] == len && memcmp(p + tk->offs[tk->slots[i]], line, len) == 0))
            i = (i + 1) & mask;
        tk->slots[i] = id;
        line = nl + 1;
    }
    for (int s = 0; s < N_SPECIAL; s++)
        tk->special_id[s] = lookup(tk, special_names[s], strlen(special_names[s]));
    tk->unk = tk->special_id[1];
    tk->cls = tk->special_id[2];
    tk->sep = tk->special_id[3];
    if (tk->unk < 0 || tk->cls < 0 || tk->sep < 0) {
        seterr(err, err_len, "%s: the vocabulary has no %s token", vocab_path,
               tk->unk < 0 ? "[UNK]" : tk->cls < 0 ? "[CLS]" : "[SEP]");
        wp_tokenizer_free(tk);
        return -1;
    }
    *out = tk;
    return 0;
}

void wp_tokenizer_free(wp_tokenizer *tk) {
    if (!tk) return;
    free(tk->pool);
    free(tk->offs);
    free(tk->lens);
    free(tk->slots);
    free(tk);
}

int32_t wp_token_id(const wp_tokenizer *tk, const char *token) {
    return tk && token ? lookup(tk, token, strlen(token)) : -1;
}

const char *wp_token(const wp_tokenizer *tk, int32_t id) {
    return tk && id >= 0 && id < tk->n ? tk->pool + tk->offs[id] : NULL;
}

int wp_vocab_size(const wp_tokenizer *tk) { return tk ? tk->n : 0; }

/* -- Character classes (as Hugging Face's BertNormalizer/BertPreTokenizer) -- */

/* Where Hugging Face's older Unicode tables disagree with utf8proc's (2.8,
 * Unicode 15): code points assigned or reclassified since, which
 * `tokenizers` (0.23) treats as a plain letter (kept, not punctuation, not
 * stripped), as punctuation, or as a mark it strips. Found by encoding
 * "x" + every code point + "x" with both and comparing the ids. */
enum { OV_NONE, OV_LETTER, OV_PUNCT, OV_MARK };
static const struct {
    int32_t lo, hi;
    uint8_t cls;
} overrides[] = {
    {0x61d, 0x61d, OV_LETTER}, {0x7fd, 0x7fd, OV_LETTER}, {0x890, 0x891, OV_LETTER},
    {0x898, 0x89f, OV_LETTER}, {0x8ca, 0x8e2, OV_LETTER}, {0x9fd, 0x9fe, OV_LETTER},
    {0xa76, 0xa76, OV_LETTER}, {0xafa, 0xaff, OV_LETTER}, {0xb55, 0xb55, OV_LETTER},
    {0xc04, 0xc04, OV_LETTER}, {0xc3c, 0xc3c, OV_LETTER}, {0xc77, 0xc77, OV_LETTER},
    {0xc84, 0xc84, OV_LETTER}, {0xd00, 0xd00, OV_LETTER}, {0xd3b, 0xd3c, OV_LETTER},
    {0xd81, 0xd81, OV_LETTER}, {0xeba, 0xeba, OV_LETTER}, {0xece, 0xece, OV_LETTER},
    {0x166d, 0x166d, OV_PUNCT}, {0x1734, 0x1734, OV_MARK}, {0x180f, 0x180f, OV_LETTER},
    {0x1885, 0x1886, OV_LETTER}, {0x1abf, 0x1ace, OV_LETTER}, {0x1b7d, 0x1b7e, OV_LETTER},
    {0x1df6, 0x1dfb, OV_LETTER}, {0x2e43, 0x2e4f, OV_LETTER}, {0x2e52, 0x2e5d, OV_LETTER},
    {0xa82c, 0xa82c, OV_LETTER}, {0xa8c5, 0xa8c5, OV_LETTER}, {0xa8ff, 0xa8ff, OV_LETTER},
    {0xa9bd, 0xa9bd, OV_LETTER}, {0x10d24, 0x10d27, OV_LETTER}, {0x10eab, 0x10ead, OV_LETTER},
    {0x10efd, 0x10eff, OV_LETTER}, {0x10f46, 0x10f50, OV_LETTER}, {0x10f55, 0x10f59, OV_LETTER},
    {0x10f82, 0x10f89, OV_LETTER}, {0x11070, 0x11070, OV_LETTER}, {0x11073, 0x11074, OV_LETTER},
    {0x110c2, 0x110c2, OV_LETTER}, {0x110cd, 0x110cd, OV_LETTER}, {0x111c9, 0x111c9, OV_PUNCT},
    {0x111cf, 0x111cf, OV_LETTER}, {0x1123e, 0x1123e, OV_LETTER}, {0x11241, 0x11241, OV_LETTER},
    {0x1133b, 0x1133b, OV_LETTER}, {0x11438, 0x1143f, OV_LETTER}, {0x11442, 0x11444, OV_LETTER},
    {0x11446, 0x11446, OV_LETTER}, {0x1144b, 0x1144f, OV_LETTER}, {0x1145a, 0x1145b, OV_LETTER},
    {0x1145d, 0x1145e, OV_LETTER}, {0x11660, 0x1166c, OV_LETTER}, {0x116b9, 0x116b9, OV_LETTER},
    {0x1182f, 0x11837, OV_LETTER}, {0x11839, 0x1183b, OV_LETTER}, {0x1193b, 0x1193c, OV_LETTER},
    {0x1193e, 0x1193e, OV_LETTER}, {0x11943, 0x11946, OV_LETTER}, {0x119d4, 0x119d7, OV_LETTER},
    {0x119da, 0x119db, OV_LETTER}, {0x119e0, 0x119e0, OV_LETTER}, {0x119e2, 0x119e2, OV_LETTER},
    {0x11a01, 0x11a0a, OV_LETTER}, {0x11a33, 0x11a38, OV_LETTER}, {0x11a3b, 0x11a47, OV_LETTER},
    {0x11a51, 0x11a56, OV_LETTER}, {0x11a59, 0x11a5b, OV_LETTER}, {0x11a8a, 0x11a96, OV_LETTER},
    {0x11a98, 0x11a9c, OV_LETTER}, {0x11a9e, 0x11aa2, OV_LETTER}, {0x11b00, 0x11b09, OV_LETTER},
    {0x11c30, 0x11c36, OV_LETTER}, {0x11c38, 0x11c3d, OV_LETTER}, {0x11c3f, 0x11c3f, OV_LETTER},
    {0x11c41, 0x11c45, OV_LETTER}, {0x11c70, 0x11c71, OV_LETTER}, {0x11c92, 0x11ca7, OV_LETTER},
    {0x11caa, 0x11cb0, OV_LETTER}, {0x11cb2, 0x11cb3, OV_LETTER}, {0x11cb5, 0x11cb6, OV_LETTER},
    {0x11d31, 0x11d36, OV_LETTER}, {0x11d3a, 0x11d3a, OV_LETTER}, {0x11d3c, 0x11d3d, OV_LETTER},
    {0x11d3f, 0x11d45, OV_LETTER}, {0x11d47, 0x11d47, OV_LETTER}, {0x11d90, 0x11d91, OV_LETTER},
    {0x11d95, 0x11d95, OV_LETTER}, {0x11d97, 0x11d97, OV_LETTER}, {0x11ef3, 0x11ef4, OV_LETTER},
    {0x11ef7, 0x11ef8, OV_LETTER}, {0x11f00, 0x11f01, OV_LETTER}, {0x11f36, 0x11f3a, OV_LETTER},
    {0x11f40, 0x11f40, OV_LETTER}, {0x11f42, 0x11f4f, OV_LETTER}, {0x11fff, 0x11fff, OV_LETTER},
    {0x12ff1, 0x12ff2, OV_LETTER}, {0x13430, 0x13440, OV_LETTER}, {0x13447, 0x13455, OV_LETTER},
    {0x16e97, 0x16e9a, OV_LETTER}, {0x16f4f, 0x16f4f, OV_LETTER}, {0x16fe2, 0x16fe2, OV_LETTER},
    {0x16fe4, 0x16fe4, OV_LETTER}, {0x1cf00, 0x1cf2d, OV_LETTER}, {0x1cf30, 0x1cf46, OV_LETTER},
    {0x1e000, 0x1e006, OV_LETTER}, {0x1e008, 0x1e018, OV_LETTER}, {0x1e01b, 0x1e021, OV_LETTER},
    {0x1e023, 0x1e024, OV_LETTER}, {0x1e026, 0x1e02a, OV_LETTER}, {0x1e08f, 0x1e08f, OV_LETTER},
    {0x1e130, 0x1e136, OV_LETTER}, {0x1e2ae, 0x1e2ae, OV_LETTER}, {0x1e2ec, 0x1e2ef, OV_LETTER},
    {0x1e4ec, 0x1e4ef, OV_LETTER}, {0x1e944, 0x1e94a, OV_LETTER}, {0x1e95e, 0x1e95f, OV_LETTER},
};

static int override_class(int32_t c) {
    if (c < 0x61d || c > 0x1e95f) return OV_NONE;
    int lo = 0, hi = (int)(sizeof overrides / sizeof overrides[0]) - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (c < overrides[mid].lo) hi = mid - 1;
        else if (c > overrides[mid].hi) lo = mid + 1;
        else return overrides[mid].cls;
    }
    return OV_NONE;
}

/* Rust's char::is_whitespace (the White_Space property). */
static int is_whitespace(int32_t c) {
    return (c >= 0x09 && c <= 0x0d) || c == 0x20 || c == 0x85 || c == 0xa0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f ||
           c == 0x205f || c == 0x3000;
}

/* Other (Cc Cf Co Cs), but tab, newline and carriage return. Unassigned
 * code points (Cn) are kept, as Hugging Face keeps them (they become
 * [UNK] or part of one). */
static int is_control(int32_t c) {
    if (c == '\t' || c == '\n' || c == '\r' || override_class(c) != OV_NONE) return 0;
    switch (utf8proc_category(c)) {
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CS: return 1;
    default: return 0;
    }
}

/* BERT's _is_chinese_char, with Hugging Face's ranges. */
static int is_cjk(int32_t c) {
    return (c >= 0x4e00 && c <= 0x9fff) || (c >= 0x3400 && c <= 0x4dbf) ||
           (c >= 0x20000 && c <= 0x2a6df) || (c >= 0x2a700 && c <= 0x2b73f) ||
           (c >= 0x2b740 && c <= 0x2b81f) || (c >= 0x2b920 && c <= 0x2ceaf) ||
           (c >= 0xf900 && c <= 0xfaff) || (c >= 0x2f800 && c <= 0x2fa1f);
}

/* ASCII punctuation (which includes $ + < = > ^ ` | ~) or Unicode P*. */
static int is_punct(int32_t c) {
    if ((c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) || (c >= 123 && c <= 126))
        return 1;
    if (c < 128) return 0;
    switch (utf8proc_category(c)) {
    case UTF8PROC_CATEGORY_PC:
    case UTF8PROC_CATEGORY_PD:
    case UTF8PROC_CATEGORY_PS:
    case UTF8PROC_CATEGORY_PE:
    case UTF8PROC_CATEGORY_PI:
    case UTF8PROC_CATEGORY_PF:
    case UTF8PROC_CATEGORY_PO: return 1;
    default: return 0;
    }
}

/* -- Encoding --------------------------------------------------------------- */

/* The state of one wp_encode call, on its stack. */
typedef struct {
    const wp_tokenizer *tk;
    int32_t *ids;
    int cap;
    int count;     /* ids so far, [CLS] included */
    int limit;     /* the most ids before [SEP] (max_len - 1) */
    int nchars;    /* chars of the current word (may pass WP_WORD_CAP) */
    int run_start; /* first char of the word that canonical reordering may move */
    int32_t cp[WP_WORD_CAP];
    uint8_t ccc[WP_WORD_CAP];
} enc_state;

static void emit(enc_state *st, int32_t id) {
    if (st->count < st->cap) st->ids[st->count] = id;
    st->count++;
}

static int full(const enc_state *st) { return st->count >= st->limit; }

/* WordPiece over the word buffer: greedy longest match, "##" continuations;
 * a word too long or with an unmatched part is one [UNK]. */
static void flush_word(enc_state *st) {
    int n = st->nchars;
    st->nchars = 0;
    st->run_start = 0;
    if (n == 0 || full(st)) return;
    if (n > WP_MAX_WORD_CHARS) {
        emit(st, st->tk->unk);
        return;
    }
    char buf[2 + WP_WORD_CAP * 4]; /* "##" then the word's UTF-8 */
    int bstart[WP_WORD_CAP + 1];   /* byte offset of each char in buf */
    buf[0] = buf[1] = '#';
    int b = 2;
    for (int i = 0; i < n; i++) {
        bstart[i] = b;
        b += (int)utf8proc_encode_char(st->cp[i], (utf8proc_uint8_t *)buf + b);
    }
    bstart[n] = b;
    char key[2 + WP_WORD_CAP * 4]; /* "##" + a continuation piece */
    key[0] = key[1] = '#';
    int32_t pieces[WP_WORD_CAP];
    int np = 0;
    for (int start = 0; start < n;) {
        int32_t id = -1;
        int stop = n;
        for (; stop > start; stop--) {
            size_t len = (size_t)(bstart[stop] - bstart[start]);
            if (start == 0) {
                id = lookup(st->tk, buf + 2, len);
            } else {
                memcpy(key + 2, buf + bstart[start], len);
                id = lookup(st->tk, key, len + 2);
            }
            if (id >= 0) break;
        }
        if (id < 0) {
            emit(st, st->tk->unk);
            return;
        }
        pieces[np++] = id;
        start = stop;
    }
    for (int i = 0; i < np && !full(st); i++) emit(st, pieces[i]);
}

/* One normalized, non-space, non-punctuation code point into the word; its
 * combining class keeps NFD's canonical order among the marks kept. */
static void push_char(enc_state *st, int32_t c, int ccc) {
    int i = st->nchars++;
    if (i >= WP_WORD_CAP) return; /* past the limit: only counted */
    while (ccc > 0 && i > st->run_start && st->ccc[i - 1] > ccc) {
        st->cp[i] = st->cp[i - 1];
        st->ccc[i] = st->ccc[i - 1];
        i--;
    }
    st->cp[i] = c;
    st->ccc[i] = (uint8_t)ccc;
}

/* NFD, accents (Mn) dropped, lowercase, then the pre-tokenizer's split on
 * whitespace and punctuation, for one code point that clean text kept. */
static void normalize(enc_state *st, int32_t c) {
    utf8proc_int32_t dec[32];
    int last_boundclass = 0;
    utf8proc_ssize_t nd = utf8proc_decompose_char(c, dec, 32, UTF8PROC_DECOMPOSE, &last_boundclass);
    if (nd < 0 || nd > 32) { /* cannot happen for a valid code point; keep it whole */
        dec[0] = c;
        nd = 1;
    }
    for (utf8proc_ssize_t k = 0; k < nd; k++) {
        int32_t d = dec[k];
        const utf8proc_property_t *pr = utf8proc_get_property(d);
        int ccc = pr->combining_class, ov = override_class(d);
        if (ov == OV_LETTER) {
            st->run_start = st->nchars;
            push_char(st, d, 0);
            continue;
        }
        if (ov == OV_PUNCT) {
            flush_word(st);
            st->cp[0] = d;
            st->ccc[0] = 0;
            st->nchars = 1;
            flush_word(st);
            continue;
        }
        if (pr->category == UTF8PROC_CATEGORY_MN || ov == OV_MARK) { /* accent stripped */
            if (ccc == 0) st->run_start = st->nchars; /* still blocks reordering */
            continue;
        }
        d = utf8proc_tolower(d);
        if (is_whitespace(d)) {
            flush_word(st);
        } else if (is_punct(d)) {
            flush_word(st);
            st->cp[0] = d;
            st->ccc[0] = 0;
            st->nchars = 1;
            flush_word(st);
        } else {
            if (ccc == 0) st->run_start = st->nchars;
            push_char(st, d, ccc);
        }
    }
}

/* One code point of the raw text through the normalizer and pre-tokenizer. */
static void feed(enc_state *st, int32_t c) {
    if (c == 0 || c == 0xfffd || is_control(c)) return;
    if (is_whitespace(c)) {
        flush_word(st);
        return;
    }
    if (is_cjk(c)) { /* padded with spaces: a word of its own */
        flush_word(st);
        normalize(st, c);
        flush_word(st);
        return;
    }
    normalize(st, c);
}

/* The special token written literally at text[i..], or -1. */
static int match_special(const wp_tokenizer *tk, const char *text, size_t len, size_t i, size_t *mlen) {
    for (int s = 0; s < N_SPECIAL; s++) {
        size_t n = strlen(special_names[s]);
        if (tk->special_id[s] >= 0 && len - i >= n && memcmp(text + i, special_names[s], n) == 0) {
            *mlen = n;
            return tk->special_id[s];
        }
    }
    return -1;
}

int wp_encode(const wp_tokenizer *tk, const char *text, size_t len, int32_t *ids, int cap) {
    if (!tk || (!text && len) || (!ids && cap > 0) || cap < 0) return -1;
    const utf8proc_uint8_t *u = (const utf8proc_uint8_t *)text;
    /* the whole text must be valid UTF-8, even a part truncation drops */
    for (size_t i = 0; i < len;) {
        if (u[i] < 0x80) {
            i++;
            continue;
        }
        utf8proc_int32_t c;
        utf8proc_ssize_t k = utf8proc_iterate(u + i, (utf8proc_ssize_t)(len - i), &c);
        if (k <= 0 || c < 0) return -1;
        i += (size_t)k;
    }
    enc_state st;
    st.tk = tk;
    st.ids = ids;
    st.cap = cap;
    st.count = 0;
    st.limit = tk->max_len - 1;
    st.nchars = 0;
    st.run_start = 0;
    emit(&st, tk->cls);
    for (size_t i = 0; i < len && !full(&st);) {
        if (u[i] == '[') {
            size_t m;
            int32_t id = match_special(tk, text, len, i, &m);
            if (id >= 0) {
                flush_word(&st);
                if (!full(&st)) emit(&st, id);
                i += m;
                continue;
            }
        }
        utf8proc_int32_t c;
        if (u[i] < 0x80) {
            c = u[i++];
        } else {
            i += (size_t)utf8proc_iterate(u + i, (utf8proc_ssize_t)(len - i), &c);
        }
        feed(&st, c);
    }
    flush_word(&st);
    emit(&st, tk->sep);
    return st.count;
}
