/*
** generate.h: text generation with a trained model (out/<dir>/generate): the model read whole
** from --init, a prompt, the forward pass with a key/value cache on one process (the
** library's kernels and GEMM, any backend), greedy or sampled decoding, the text streamed to
** stdout. Needs the program's model (its roles and sizes), not its layout: a directory of
** any layout builds it and runs it on one process. The library's top, beside train.c.
*/
#ifndef GPT_GENERATE_H
#define GPT_GENERATE_H

#include <stddef.h>
#include <stdint.h>

#include "gpt.h"      // defines: gpt_program

/* A tokenizer for --tokenizer, as the program's entry point supplies it (generate_main.c: the
** functions of tools/tokenizer.h, whose library the training library does not link; its type
** is opaque here): load a tokenizer.json (NULL and a message in err when it cannot), its
** number of ids, the ids that begin and end a document (-1: none), a text's ids appended to
** *ids, an id's bytes. */
struct tok_model;
typedef struct {
    struct tok_model *(*load)(const char *path, char *err, size_t errcap);
    int (*vocab_size)(const struct tok_model *t);
    int (*bod_id)(const struct tok_model *t);
    int (*eod_id)(const struct tok_model *t);
    int (*encode)(const struct tok_model *t, const char *text, size_t len, int32_t **ids,
                  size_t *n, size_t *cap);
    const char *(*bytes)(const struct tok_model *t, int32_t id, size_t *len);
} gen_tokenizer_api;

/* The generate program: its flags, the model from --init, the text. 'tok': the tokenizer
** --tokenizer loads (NULL: the program has none, and refuses --tokenizer). */
int gpt_generate(int argc, char **argv, const gpt_program *prog, const gen_tokenizer_api *tok);

#endif
