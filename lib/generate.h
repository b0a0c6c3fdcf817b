/*
** generate.h: text generation with a trained model (out/<dir>/generate): the model read whole
** from --init, a prompt, the forward pass with a key/value cache on one process (the
** library's kernels and GEMM, any backend), greedy or sampled decoding, the text streamed to
** stdout. Needs the program's model (its roles and sizes), not its layout: a directory of
** any layout builds it and runs it on one process. The library's top, beside train.c.
*/
#ifndef GPT_GENERATE_H
#define GPT_GENERATE_H

#include "gpt.h"      // defines: gpt_program

int gpt_generate(int argc, char **argv, const gpt_program *prog);

#endif
