/*
** tensors.c: the model's tensor list of tensors.h, from the roles of the program (checkpoint
** order: Hugging Face GPT-2's, or Llama's). Knows the roles' scopes, not the layout: which
** rank holds which piece is the stage's business (stage.c, from the generated tables).
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tensors.h"

static int role_pos[256];       /* a role's position among the roles of its scope */
static int scope_count[4];      /* roles per scope */

/*
** The tensor list from the roles, into a new array *out (the caller owns it): BEFORE roles, per
** layer its LAYER roles then per expert the EXPERT roles, then AFTER roles; then, with
** dims.expert_bias, each layer's expert bias, whose first index goes to *ebias (-1: none).
** Each tensor's random stream is FNV-1a 64 of its name. Returns the number of tensors. Called
** once, before lib_tensor_index.
*/
int lib_tensors_build(const gpt_program *prog, lib_tensor **out, int *ebias)
{
    RT_CHECK(prog->nroles <= 256, "too many tensor roles (%d)", prog->nroles);
    for (int r = 0; r < prog->nroles; r++)
        role_pos[r] = scope_count[prog->roles[r].scope]++;
    int per_layer = scope_count[GPT_LAYER] + prog->experts * scope_count[GPT_EXPERT];
    int n = scope_count[GPT_BEFORE] + prog->layers * per_layer + scope_count[GPT_AFTER];
    int nb = prog->dims.expert_bias ? prog->layers : 0;    /* the expert biases, last */
    lib_tensor *ts = calloc((size_t)(n + nb), sizeof *ts);
    RT_CHECK(ts, "out of memory");
    *ebias = nb ? n : -1;
    for (int l = 0; l < nb; l++) {
        /* state, not a parameter: Megatron's mlp.router.expert_bias buffer; Llama files as
        ** Hugging Face's DeepSeek-V3 name it (e_score_correction_bias) */
        lib_tensor *t = &ts[n + l];
        snprintf(t->name, sizeof t->name, prog->dims.llama
                 ? "model.layers.%d.block_sparse_moe.gate.e_score_correction_bias"
                 : "h.%d.mlp.router.expert_bias", l);
        t->rows = 1;
        t->cols = prog->experts;
        t->ndim = 1;
        t->init = GPT_INIT_ZERO;
        t->stream = rt_fnv1a64(t->name);
    }
    for (int r = 0; r < prog->nroles; r++) {
        const gpt_role *ro = &prog->roles[r];
        int layers = ro->scope == GPT_LAYER || ro->scope == GPT_EXPERT ? prog->layers : 1;
        int experts = ro->scope == GPT_EXPERT ? prog->experts : 1;
        for (int l = 0; l < layers; l++)
            for (int e = 0; e < experts; e++) {
                lib_tensor *t = &ts[lib_tensor_index(prog, r, l, e)];
                snprintf(t->name, sizeof t->name, ro->name, l, e);
                t->rows = ro->rows;
                t->cols = ro->cols;
                t->ndim = ro->ndim;
                t->init = ro->init;
                t->std = ro->std;
                t->stream = rt_fnv1a64(t->name);
            }
    }
    *out = ts;
    return n + nb;
}

/*
** The index in the tensor list of role 'role' in layer 'layer' (0-based, global) and expert
** 'expert' (both ignored where the role's scope has none). Needs lib_tensors_build first.
*/
int lib_tensor_index(const gpt_program *prog, int role, int layer, int expert)
{
    int per_layer = scope_count[GPT_LAYER] + prog->experts * scope_count[GPT_EXPERT];
    int at = scope_count[GPT_BEFORE] + layer * per_layer;
    switch (prog->roles[role].scope) {
    case GPT_BEFORE: return role_pos[role];
    case GPT_LAYER: return at + role_pos[role];
    case GPT_EXPERT: return at + scope_count[GPT_LAYER] + expert * scope_count[GPT_EXPERT] +
                            role_pos[role];
    default: return scope_count[GPT_BEFORE] + prog->layers * per_layer + role_pos[role];
    }
}

/* The index of the tensor named 'name' among t[0..n-1], or -1. */
int lib_tensor_find(const lib_tensor *t, int n, const char *name)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(t[i].name, name)) return i;
    return -1;
}

/* The names of t[0..n-1]: a new array of n pointers into t (the caller frees the array). */
const char **lib_tensor_names(const lib_tensor *t, int n)
{
    const char **names = malloc(sizeof *names * (size_t)n);
    RT_CHECK(names, "out of memory");
    for (int i = 0; i < n; i++) names[i] = t[i].name;
    return names;
}
