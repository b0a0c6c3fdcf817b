/*
** lr.h: the learning-rate schedule, Megatron's OptimizerParamScheduler as a pure function of
** the flags (--lr, --min-lr, --warmup, --decay-steps, the styles) and the steps done. Called by
** gpt_main before every step; the formulas are in README.md, "Learning rate".
*/
#ifndef GPT_LR_H
#define GPT_LR_H

#include "flags.h"    // defines: lib_flags, LR_*, WSD_*

double lib_lr(const lib_flags *f, long long gbs, int done);

#endif
