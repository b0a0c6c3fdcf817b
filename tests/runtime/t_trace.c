/*
** t_trace.c: one call of each communication kind, blocking and started, on two ranks, for the
** trace test (RT_TRACE, rt.h "Trace"): tests/runtime/suite.sh runs it with RT_TRACE set and
** compares each rank's trace file with the lines below, exactly (and, with RT_TRACE_TIMES=1,
** with a time at the end of each blocking call's and wait's line). Either backend.
*/
#include "t_util.h"     // defines: t_to_dev, t_alloc, rt.h

int main(int argc, char **argv)
{
    rt_init(&argc, &argv, 2, "tp2");
    int r = rt_rank();
    static const int pair[2] = { 0, 1 };
    rt_group *g = rt_group_create("tp", pair, 2);
    float *x = rt_malloc(128 * sizeof(float));
    int *c = rt_malloc(8 * sizeof(int));
    rt_allreduce(x, 3, RT_F32, RT_SUM, g);                  /* allreduce tp 3 f32 sum */
    rt_allreduce(c, 2, RT_I32, RT_MAX, rt_group_world());   /* allreduce world 2 i32 max */
    rt_allgather(x, x + 8, 4, RT_F32, g);                   /* allgather tp 4 f32 */
    rt_reduce_scatter(x + 16, x, 5, RT_F32, g);             /* reduce_scatter tp 5 f32 */
    size_t cnt[2] = { 1, 1 }, dsp[2] = { 0, 1 };
    rt_alltoallv(x, cnt, dsp, x + 32, cnt, dsp, RT_F32, g); /* alltoallv tp f32 */
    rt_barrier(NULL);                                       /* barrier world */
    rt_p2p_op ops[2] = { { 1, x, 6, RT_F32, 1 - r, 0 }, { 0, x + 40, 6, RT_F32, 1 - r, 0 } };
    rt_p2p(ops, 2);                       /* p2p send <peer> 6 f32 0 recv <peer> 6 f32 0 */
    rt_req *a = rt_allreduce_start(x + 48, 7, RT_F32, RT_SUM, g);
                                          /* allreduce tp 7 f32 sum start 1 */
    rt_req *p = rt_p2p_start(ops, 2);     /* p2p send <peer> 6 f32 0 recv <peer> 6 f32 0 start 2 */
    rt_progress();                                          /* (nothing) */
    rt_req *s = rt_reduce_scatter_start(x + 64, x + 64 + 4 * r, 4, RT_BF16, g);
                                          /* reduce_scatter tp 4 bf16 start 3 */
    rt_req *ag = rt_allgather_start(x + 80 + 2 * r, x + 80, 2, RT_I32, g);
                                          /* allgather tp 2 i32 start 4 */
    rt_wait(p);                                             /* wait 2 p2p */
    rt_wait(a);                                             /* wait 1 allreduce tp */
    rt_allreduce(x + 96, 0, RT_F32, RT_MAX, g);             /* allreduce tp 0 f32 max */
    rt_wait(ag);                                            /* wait 4 allgather tp */
    rt_wait(s);                                             /* wait 3 reduce_scatter tp */
    rt_wait(NULL);                                          /* (nothing) */
    rt_free(x);
    rt_free(c);
    rt_finalize();
    return 0;
}
