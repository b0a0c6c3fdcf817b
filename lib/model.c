/*
** model.c: the generated code's view of the library's state (gpt.h accessors): a layer's
** activations, tensors and gradients by memory-plan entry and field, the stage's buffers, a
** chunk's input, output and gradient, the micro-batch's tokens, groups and neighbours, the
** context-parallel positions, and the pipeline messages of the schedule. What a layer computes
** and communicates is the generated code's (gen/lua/layer.lua); nothing here communicates.
*/
#include "stage.h"

void *const *gpt_acts(int chunk, int slot, int layer)
{
    return gpt.chunk[chunk].acts[slot].layer[layer].m;
}

void *const *gpt_params(int chunk, int layer)
{
    return layer < 0 ? lib.other_p : gpt.chunk[chunk].layers[layer].p;
}

float *const *gpt_grads(int chunk, int layer)
{
    return layer < 0 ? lib.other_g : gpt.chunk[chunk].layers[layer].g;
}

void *gpt_stage_buf(gpt_mem_id id)
{
    return lib.mem[id];
}

void *gpt_x(int chunk, int slot) { return gpt.chunk[chunk].acts[slot].x; }
void *gpt_dy(int chunk, int slot) { return gpt.chunk[chunk].acts[slot].dy; }
int *gpt_tokens(int chunk, int slot) { return gpt.chunk[chunk].acts[slot].tokens; }

const void *gpt_layer_in(int chunk, int slot, int layer)
{
    lib_chunk_acts *a = &gpt.chunk[chunk].acts[slot];
    return layer == 0 ? a->x : a->layer[layer - 1].m[GPT_M_L_RES2];
}

void *gpt_out(int chunk, int slot)
{
    int last = gpt.stage->chunks[chunk].layers - 1;
    lib_chunk_acts *a = &gpt.chunk[chunk].acts[slot];
    return last < 0 ? a->x : a->layer[last].m[GPT_M_L_RES2];   /* no layers: its input */
}

const int *gpt_inputs(int mb) { return gpt.in->inputs + (size_t)mb * gpt.d.N; }
const int *gpt_targets(int mb) { return gpt.in->targets + (size_t)mb * gpt.d.N; }

rt_group *gpt_grp(gpt_group id) { return gpt.grp[id]; }

int gpt_peer(int which)
{
    switch (which) {
    case GPT_PP_PREV: return gpt.pp_prev;
    case GPT_PP_NEXT: return gpt.pp_next;
    case GPT_CP_PREV: return gpt.cp_prev;
    case GPT_CP_NEXT: return gpt.cp_next;
    default: RT_CHECK(0, "gpt_peer: no neighbour %d", which);
    }
    return -1;
}

int gpt_tp_rank(void) { return gpt.tp_rank; }
int gpt_cp_rank(void) { return gpt.cp_rank; }
int gpt_vocab_start(void) { return gpt.vocab_start; }
int gpt_vocab_valid(void) { return gpt.vocab_valid; }

/*
** Context parallelism (docs/megatron.md §12): a cp rank holds two chunks of T_CHUNK positions of
** every sequence, chunk cp_rank (local rows [0, T_CHUNK*B)) and chunk 2*CP-1-cp_rank, so every
** rank has the same share of the causal work. The global position of local position t:
*/
int gpt_cp_position(int t)
{
    int tc = gpt.d.t_chunk, half = t >= tc;
    return (half ? 2 * gpt.d.cp - 1 - gpt.cp_rank : gpt.cp_rank) * tc + t % tc;
}

gpt_moe *gpt_moe_of(int chunk, int slot, int layer)
{
    return &gpt.chunk[chunk].acts[slot].layer[layer].moe;
}

void gpt_sched_bind(const gpt_sched_step *st)
{
    gpt.chunk[st->chunk].acts[st->slot].dy = st->dy >= 0 ? lib_grad_buffer(st->dy) : NULL;
}

rt_p2p_op gpt_sched_op(const gpt_sched_msg *g)
{
    size_t n = (size_t)gpt.d.n_sp * gpt.d.C;
    switch (g->kind) {
    case GPT_SEND_ACT:
        return (rt_p2p_op){ 1, gpt_out(g->chunk, g->slot), n, gpt.d.act, gpt.pp_next,
                            GPT_TAG_ACT };
    case GPT_RECV_ACT:
        return (rt_p2p_op){ 0, gpt_x(g->chunk, g->slot), n, gpt.d.act, gpt.pp_prev,
                            GPT_TAG_ACT };
    case GPT_SEND_GRAD:
        return (rt_p2p_op){ 1, lib_grad_buffer(g->slot), n, gpt.d.act, gpt.pp_prev,
                            GPT_TAG_GRAD };
    case GPT_RECV_GRAD:
        return (rt_p2p_op){ 0, lib_grad_buffer(g->slot), n, gpt.d.act, gpt.pp_next,
                            GPT_TAG_GRAD };
    default:
        RT_CHECK(0, "schedule: a message of kind %d (a generator bug)", g->kind);
    }
    return (rt_p2p_op){ 0 };
}
