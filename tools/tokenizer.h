/*
** tokenizer.h: a Hugging Face tokenizer (tokenizer.json: byte-level BPE with its pre-tokenizer
** pattern, as GPT-2 and Llama 3 use; added/special tokens) for the tools and programs that
** turn text into token ids and back: build/tools/tokenize (text or JSONL to a Megatron indexed
** dataset or a nanoGPT .bin) and the generated programs' `generate` (prompts in, text out).
** Built as build/tools/libtokenizer.a (tools/tools.mk, which also defines TOKENIZER_LIBS: the
** libraries a program linking it needs). A loaded tokenizer is read-only: several threads may
** encode with one at once.
*/
#ifndef GPT_TOKENIZER_H
#define GPT_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

typedef struct tok_model tok_model;

/* The tokenizer of PATH (a tokenizer.json, or a directory holding one); NULL when it cannot be
** used, with a message naming the file and what is wrong in err (errcap bytes). */
tok_model *tok_load(const char *path, char *err, size_t errcap);
void tok_free(tok_model *t);

/* The number of ids (the largest id + 1, added tokens included). */
int tok_vocab_size(const tok_model *t);

/* The id that ends a document (GPT-2's <|endoftext|>, Llama 3's <|end_of_text|>), and the one
** that begins one (Llama 3's <|begin_of_text|>; -1 when the tokenizer has none: GPT-2). Found
** by name: the first of <|endoftext|>, <|end_of_text|>, </s>, <eos> (and <|begin_of_text|>,
** <s>, <bos>) that the tokenizer has; the end id too is -1 when it has none. */
int tok_eod_id(const tok_model *t);
int tok_bod_id(const tok_model *t);

/* The id of the token whose text is exactly s (a special token such as "<|endoftext|>"), or -1. */
int tok_id_of(const tok_model *t, const char *s);

/* Append the ids of text[0..len) (UTF-8) to *ids (grown with realloc; *n ids, room for *cap).
** Special tokens written in the text are recognised as the tokenizer's added tokens are.
** 0, or -1 when out of memory. */
int tok_encode(const tok_model *t, const char *text, size_t len,
               int32_t **ids, size_t *n, size_t *cap);

/* The bytes id stands for (byte-level BPE: the raw bytes, possibly part of a UTF-8 character;
** a special token: its text); *len set. NULL for an id outside the vocabulary. Concatenating
** the bytes of an encoding's ids gives back its text. */
const char *tok_bytes(const tok_model *t, int32_t id, size_t *len);

#endif
