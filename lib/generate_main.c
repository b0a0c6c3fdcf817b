/*
** generate_main.c: the entry point of every generated directory's generate program: the
** program's description (program.c: gpt_program_desc) and the tokenizer library
** (tools/tokenizer.h, build/tools/libtokenizer.a) to the library's gpt_generate. Linked as an
** object of its own, not from the library's archive (which holds train's main.c).
*/
#include "generate.h"
#include "../tools/tokenizer.h"

static void *load(const char *path, char *err, size_t errcap)
{
    return tok_load(path, err, errcap);
}
static int vocab_size(const void *t) { return tok_vocab_size(t); }
static int bod_id(const void *t) { return tok_bod_id(t); }
static int eod_id(const void *t) { return tok_eod_id(t); }
static int encode(const void *t, const char *text, size_t len, int32_t **ids, size_t *n,
                  size_t *cap)
{
    return tok_encode(t, text, len, ids, n, cap);
}
static const char *bytes(const void *t, int32_t id, size_t *len) { return tok_bytes(t, id, len); }

static const gen_tokenizer_api tokenizer = { load, vocab_size, bod_id, eod_id, encode, bytes };

int main(int argc, char **argv)
{
    return gpt_generate(argc, argv, &gpt_program_desc, &tokenizer);
}
