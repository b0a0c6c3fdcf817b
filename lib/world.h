/*
** world.h: collectives over the whole world on host values, for the decisions every rank must
** take alike (a file's first bad token, whether an output can be written, the newest complete
** checkpoint, who reports a bad gradient) and for the barriers of writing files. Every rank
** calls each of them at the same point. Called by gpt_main, faults.c, weights.c, ckpt.c.
*/
#ifndef GPT_WORLD_H
#define GPT_WORLD_H

#include "rt.h"       // defines: rt_op (RT_SUM, RT_MAX)

void lib_world_allreduce(long long *v, rt_op op);
void lib_world_allreduce_max(long long *v);
void lib_world_barrier(void);

#endif
