/*
** world.c: the world collectives of world.h. Collectives take device memory: a value travels
** through the stage's scalar scratch (lib.stat_dev, X_STAT in the memory plan), so nothing is
** allocated outside the plan; they may run once lib_stage_setup has run.
*/
#include "world.h"
#include "stage.h"    // defines: lib (stat_dev)

/* *v = op over the world of every rank's *v. */
void lib_world_allreduce(long long *v, rt_op op)
{
    long long *dev = (long long *)(void *)lib.stat_dev;
    rt_memcpy(dev, v, sizeof *v, RT_H2D);
    rt_allreduce(dev, 1, RT_I64, op, rt_group_world());
    rt_memcpy(v, dev, sizeof *v, RT_D2H);
}

/* *v = the maximum over the world of every rank's *v (a lib_world_max_fn, data.h). */
void lib_world_allreduce_max(long long *v)
{
    lib_world_allreduce(v, RT_MAX);
}

/* Every rank of the world has reached this point. */
void lib_world_barrier(void)
{
    rt_barrier(NULL);
}
