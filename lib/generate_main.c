/*
** generate_main.c: the entry point of every generated directory's generate program: the
** program's description (program.c: gpt_program_desc) and the tokenizer library
** (tools/tokenizer.h, build/tools/libtokenizer.a) to the library's gpt_generate. Linked as an
** object of its own, not from the library's archive (which holds train's main.c).
*/
#include "generate.h"
#include "../tools/tokenizer.h"

static const gen_tokenizer_api tokenizer = {
    tok_load, tok_vocab_size, tok_bod_id, tok_eod_id, tok_encode, tok_bytes,
};

int main(int argc, char **argv)
{
    return gpt_generate(argc, argv, &gpt_program_desc, &tokenizer);
}
