/* wordpiece: the WordPiece tokenizer of uncased BERT vocabularies.
 *
 * Matches Hugging Face `tokenizers` for a BertNormalizer (clean text,
 * CJK characters split, accents stripped, lowercase) + BertPreTokenizer
 * (whitespace and punctuation split) + WordPiece (greedy longest match,
 * continuations prefixed "##", a word longer than 100 characters or one
 * that cannot be matched becomes [UNK]) + the [CLS] ... [SEP] template,
 * truncated to the model's maximum length. Unicode through utf8proc.
 *
 * Code a user copies (samples/bert): not part of the shapejit library. */
#ifndef SJ_SAMPLES_WORDPIECE_H
#define SJ_SAMPLES_WORDPIECE_H

#include <stddef.h>
#include <stdint.h>

typedef struct wp_tokenizer wp_tokenizer;

/* Load a vocab.txt (one token per line; a token's id is its line number,
 * from 0). max_len: the most ids wp_encode returns, [CLS] and [SEP]
 * included (the model's max_position_embeddings, e.g. 512; >= 2).
 * Returns 0, or -1 with a message naming the file and what was wrong in
 * err (a missing file, a vocabulary without [CLS], [SEP] or [UNK], ...). */
int wp_tokenizer_load(const char *vocab_path, int max_len, wp_tokenizer **out, char *err,
                      size_t err_len);

/* NULL is a no-op. */
void wp_tokenizer_free(wp_tokenizer *tk);

/* Tokenize UTF-8 text of len bytes into ids: [CLS] pieces... [SEP], the
 * pieces truncated so that the whole is at most the loaded max_len. Writes
 * at most cap ids and returns the full count (which may exceed cap: call
 * again with more room), or -1 when text is not valid UTF-8. An empty text
 * gives [CLS] [SEP]. Thread-safe: the tokenizer is read only. */
int wp_encode(const wp_tokenizer *tk, const char *text, size_t len, int32_t *ids, int cap);

/* A token's id, or -1; the token of an id, or NULL. */
int32_t wp_token_id(const wp_tokenizer *tk, const char *token);
const char *wp_token(const wp_tokenizer *tk, int32_t id);
int wp_vocab_size(const wp_tokenizer *tk);

#endif
