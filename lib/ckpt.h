/*
** ckpt.h: resume checkpoints: every rank's parameters, optimizer state and step, in
** --ckpt-dir/step_N/rank_R.bin, for --resume to continue bit-exactly (ckpt.c). Tied to the
** program that wrote them (model, layout, rank; checksummed); one job per directory (its LOCK).
** Whole-model files are weights.h's.
*/
#ifndef GPT_CKPT_H
#define GPT_CKPT_H

#include "flags.h"    // defines: lib_flags (ckpt_dir, seed)

void lib_ckpt_lock(const lib_flags *f);
void lib_ckpt_save(const lib_flags *f, int step, int updates, int skipped);
int lib_ckpt_newest(const char *dir);
void lib_ckpt_clean(const char *dir);
void lib_ckpt_load(const lib_flags *f, int step, int *updates, int *skipped);
void lib_ckpt_reshard(const lib_flags *f, int *step, int *updates, int *skipped);
long long lib_ckpt_bytes(void);

#endif
