/*
** ckpt.h: resume checkpoints: every rank's parameters, optimizer state and step, in
** --ckpt-dir/step_N/rank_R.bin, for --resume to continue bit-exactly (ckpt.c). Tied to the
** program that wrote them (model, layout, rank; checksummed); one job per directory (its LOCK).
** Whole-model files are weights.h's.
*/
#ifndef GPT_CKPT_H
#define GPT_CKPT_H

#include "flags.h"    // defines: lib_flags (ckpt_dir, seed)

/* Where a run stands after 'step' steps: the optimizer updates made (steps not skipped), the
** steps skipped, and the samples its steps and its evaluations have read (Megatron's
** consumed_train_samples and consumed_valid_samples; -1 from a file older than version 5:
** then step x GBS, and what the evaluations until 'step' read). */
typedef struct { int step, updates, skipped; long long samples, valid_samples; } lib_ckpt_pos;

void lib_ckpt_lock(const lib_flags *f);
void lib_ckpt_save(const lib_flags *f, const lib_ckpt_pos *at);
int lib_ckpt_newest(const char *dir);
void lib_ckpt_clean(const char *dir);
void lib_ckpt_load(const lib_flags *f, int step, lib_ckpt_pos *at);
void lib_ckpt_reshard(const lib_flags *f, lib_ckpt_pos *at);
long long lib_ckpt_bytes(void);

#endif
