/*
** groups.c: this rank's place in the job, computed from the generator's grid description
** (gpt_grid: the size and rank stride of every axis; gpt_kind: which axes vary inside a group):
** its coordinates on the dense (tp-cp-dp-pp) and expert (etp-ep-edp-pp) grids, and the members
** of each of its groups, as Megatron's generate_masked_orthogonal_rank_groups orders them
** (docs/megatron.md §1). Nothing here is linear in the world size: a rank computes its own
** groups only. Called once by gpt_main; collective over the world (rt_group_create).
*/
#include <stdio.h>
#include <stdlib.h>

#include "stage.h"

static const char *const group_names[GPT_NGROUPS] = {
#define GPT_GRP_NAME(id, name) name,
    GPT_GROUPS(GPT_GRP_NAME)
#undef GPT_GRP_NAME
};

static int coord(const gpt_grid *g, int rank, int axis)
{
    return (rank / g->stride[axis]) % g->size[axis];
}

/*
** The members of rank r's group of kind k, in group-rank order, into out (room for the world);
** returns their number, 0 when r is in no group of that kind (embd off the first and last
** stage). The generator lists the axes that vary inside the group, the fastest first, with
** their sizes and strides (gen/lua/topology.lua decides the order): the group's first member
** is r without its coordinates on them, and member j adds j's mixed-radix digits.
*/
static int members(const gpt_kind *k, int r, int *out)
{
    if (k->grid == GPT_GRID_EMBD) {      /* the ends of the pipeline group */
        int P = k->msize[0], s = k->mstride[0], p = (r / s) % P;
        if (p != 0 && p != P - 1) return 0;
        out[0] = r - p * s;
        if (P == 1) return 1;
        out[1] = out[0] + (P - 1) * s;
        return 2;
    }
    int base = r, n = 1;
    for (int i = 0; i < k->naxes; i++) {
        base -= (r / k->mstride[i]) % k->msize[i] * k->mstride[i];
        n *= k->msize[i];
    }
    for (int j = 0; j < n; j++) {
        int rem = j, rank = base;
        for (int i = 0; i < k->naxes; i++) {
            rank += rem % k->msize[i] * k->mstride[i];
            rem /= k->msize[i];
        }
        out[j] = rank;
    }
    return n;
}

/*
** Set this rank's coordinates and create the communicators the program uses (every rank
** calls rt_group_create for the same kinds in the same order; NULL for kinds not created).
*/
void lib_groups_create(const gpt_program *prog)
{
    int r = rt_rank();
    const gpt_grid *dn = &prog->dense, *ex = &prog->expert;
    gpt.tp_rank = coord(dn, r, GPT_AX_TP);
    gpt.cp_rank = coord(dn, r, GPT_AX_CP);
    gpt.dp_rank = coord(dn, r, GPT_AX_DP);
    gpt.pp_rank = coord(dn, r, GPT_AX_PP);
    gpt.etp_rank = coord(ex, r, GPT_AX_TP);
    gpt.ep_rank = coord(ex, r, GPT_AX_EP);
    gpt.edp_rank = coord(ex, r, GPT_AX_DP);
    int *m = malloc(sizeof(int) * (size_t)prog->world);
    RT_CHECK(m, "out of memory");
    for (int i = 0; i < GPT_NGROUPS; i++) gpt.grp[i] = NULL;
    for (int i = 0; i < prog->nkinds; i++) {
        const gpt_kind *k = &prog->kinds[i];
        if (!k->create) continue;
        int n = members(k, r, m);
        gpt.grp[k->id] = rt_group_create(group_names[k->id], m, n);
    }
    /* pipeline neighbours, wrapping (the last stage's next is stage 0) */
    int P = dn->size[GPT_AX_PP];
    gpt.pp_prev = r + ((gpt.pp_rank + P - 1) % P - gpt.pp_rank) * dn->stride[GPT_AX_PP];
    gpt.pp_next = r + ((gpt.pp_rank + 1) % P - gpt.pp_rank) * dn->stride[GPT_AX_PP];
    /* context-parallel ring neighbours (docs/megatron.md §12) */
    int CP = dn->size[GPT_AX_CP];
    gpt.cp_prev = r + ((gpt.cp_rank + CP - 1) % CP - gpt.cp_rank) * dn->stride[GPT_AX_CP];
    gpt.cp_next = r + ((gpt.cp_rank + 1) % CP - gpt.cp_rank) * dn->stride[GPT_AX_CP];
    /* this tp rank's vocabulary rows that are real (the rest of its rows is padding) */
    int vl = prog->dims.v_local, real = prog->vocab - gpt.tp_rank * vl;
    gpt.vocab_start = gpt.tp_rank * vl;
    gpt.vocab_valid = real < 0 ? 0 : real < vl ? real : vl;
    free(m);
}

/* The world's barrier between two ranks' lines of --show-groups. */
static void show_barrier(void)
{
    rt_barrier(NULL);
}

/*
** --show-groups: print this rank's coordinates and groups, one line each, in rank order
** (the rank's own lines are gathered by rank 0 with one world barrier per rank: a check, not
** a hot path).
*/
void lib_groups_print(const gpt_program *prog)
{
    int *m = malloc(sizeof(int) * (size_t)prog->world);
    RT_CHECK(m, "out of memory");
    for (int q = 0; q < rt_world(); q++) {
        if (q == rt_rank()) {
            printf("rank %d: tp %d cp %d dp %d pp %d etp %d ep %d edp %d\n", q, gpt.tp_rank,
                   gpt.cp_rank, gpt.dp_rank, gpt.pp_rank, gpt.etp_rank, gpt.ep_rank,
                   gpt.edp_rank);
            for (int i = 0; i < prog->nkinds; i++) {
                const gpt_kind *k = &prog->kinds[i];
                int n = members(k, q, m);
                printf("rank %d: %s", q, group_names[k->id]);
                if (n == 0) printf(" -");
                for (int j = 0; j < n; j++) printf("%s%d", j ? "," : " ", m[j]);
                printf("\n");
            }
            fflush(stdout);
        }
        show_barrier();
    }
    free(m);
}
