/*
** tensors.h: the model's tensors in checkpoint order (Hugging Face's names and shapes),
** expanded from the program's roles (gpt_role: per layer, per expert, before and after the
** layers), and the expert biases after them. Built once by gpt_main; the stage setup maps
** its parameters to them (lib_tensor_index), --init and --save name them. No runtime state.
*/
#ifndef GPT_TENSORS_H
#define GPT_TENSORS_H

#include <stdint.h>

#include "gpt.h"      // defines: gpt_program, gpt_role, gpt_init

/* One tensor of the model (a whole tensor, not a rank's piece of it). */
typedef struct {
    char name[96];
    int rows, cols, ndim;
    gpt_init init;
    float std;
    uint64_t stream;            /* FNV-1a 64 of the name: its random values' stream */
} lib_tensor;

int lib_tensors_build(const gpt_program *prog, lib_tensor **out, int *ebias);
int lib_tensor_index(const gpt_program *prog, int role, int layer, int expert);
int lib_tensor_find(const lib_tensor *t, int n, const char *name);
const char **lib_tensor_names(const lib_tensor *t, int n);

#endif
