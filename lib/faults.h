/*
** faults.h: what goes wrong in a run and how every rank reacts alike (README.md, "When things
** go wrong"): faults injected for tests (GPT_FAULT), the exit signals (--exit-signal,
** --exit-grace), the start-up check that every output can be written, and the stop at a step
** that is not finite (--skip-bad-steps). Called by gpt_main; the points of checkpoint writing
** (lib_fault_point) by weights.c and ckpt.c.
*/
#ifndef GPT_FAULTS_H
#define GPT_FAULTS_H

#include "flags.h"    // defines: lib_flags
#include "gpt.h"      // defines: gpt_step_out

void lib_faults_parse(void);
void lib_faults_step(const lib_flags *f, int step);
void lib_fault_point(void);
void lib_faults_report(void);

void lib_signals_install(const lib_flags *f);
void lib_signals_stepping(void);
int lib_exit_signal(void);

void lib_check_outputs(const lib_flags *f, long long ckpt_bytes, long long save_bytes);
void lib_bad_step_stop(const lib_flags *f, int step, const gpt_step_out *out) RT_NORETURN;

#endif
