/*
** weights.h: the whole model's parameters in and out of the run: initialised from --seed,
** loaded from --init (Hugging Face safetensors: a file, or an index and its shards), written to
** --save (one file, or a Hugging Face directory: hfdir.h) with the model's Hugging Face
** names; and for one-process programs (generate) the whole tensors into host memory.
** Layout-free: any layout loads what
** any other saved. Called by gpt_main after the stage's setup (weights.c).
*/
#ifndef GPT_WEIGHTS_H
#define GPT_WEIGHTS_H

#include "flags.h"    // defines: lib_flags (--save, --save-dtype, --save-shard-size, --tokenizer)
#include "tensors.h"  // defines: lib_tensor

void lib_weights_init(unsigned long long seed);
void lib_weights_load(const char *arg);
void lib_weights_save(const lib_flags *f);
long long lib_weights_save_bytes(const lib_flags *f);
/* the whole tensors ts[0..n) from --init's checkpoint, each handed to take (f32), one process */
void lib_weights_read(const char *arg, const lib_tensor *ts, int n, const char *model,
                      void (*take)(int t, const float *data, void *ctx), void *ctx);

#endif
