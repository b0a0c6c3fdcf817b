/*
** t_fault.c: programs that fail on purpose, one mode per run; tests/runtime/suite.sh runs each
** under `timeout 60 mpirun ...` and checks the exit status, the time taken and the message.
**   wrongnp    built for 64 ranks (tp8 pp8 dp1), launched with fewer
**   check      rank 1 fails an RT_CHECK while rank 0 waits in an allreduce
**   mpierr     rank 0 makes an MPI call with an invalid rank through RT_MPI
**   exit       rank 1 calls exit(0) without rt_finalize while rank 0 waits in an allreduce
**   _exit      rank 1 calls _exit(3) (no atexit handlers) while rank 0 waits in an allreduce
**   raise      rank 1 raises SIGKILL while rank 0 waits in an allreduce
**   hang PIDFILE  rank 1 writes its pid and waits in a receive; the suite kills it (kill -9)
**              while rank 0 waits in an allreduce
**   norecv     rank 0 receives from rank 1, which never sends (RT_TIMEOUT decides)
**   norecv2    the same through rt_p2p_start / rt_wait
**   nowait     rank 0 finalizes with a started allreduce not waited
**   stuck      rank 0 allreduces on group tp = {0,1}; rank 1 never joins
**   asyncstuck rank 0 starts an allreduce on tp, computes, waits; rank 1 never starts it
**   notmember  rank 1 passes a group it is not in
**   nullgroup  a collective on the NULL group of a rank that is in no group
**   badtable   two ranks list one group's members in different orders
**   nofinalize one rank returns from main without rt_finalize
**   ok         a clean run (the control)
*/
#define _POSIX_C_SOURCE 200809L
#include "t_util.h"   // defines: t_to_dev, ...

#include <mpi.h>
#include <signal.h>
#include <unistd.h>

static void wait_in_allreduce(void)
{
    float *d = rt_malloc(1024 * sizeof(float));
    rt_allreduce(d, 1024, RT_F32, RT_SUM, rt_group_world());
    rt_free(d);
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "ok";
    if (!strcmp(mode, "wrongnp"))
        rt_init(&argc, &argv, 64, "tp8 pp8 dp1");
    else
        rt_init(&argc, &argv, 0, NULL);
    int r = rt_rank();

    if (!strcmp(mode, "check")) {
        if (r == 1)
            RT_CHECK(1 + 1 == 3, "custom failure %d", 42);
        wait_in_allreduce();
    } else if (!strcmp(mode, "mpierr")) {
        int x = 0;
        if (r == 0)
            RT_MPI(MPI_Send(&x, 1, MPI_INT, 9999, 0, MPI_COMM_WORLD));
        wait_in_allreduce();
    } else if (!strcmp(mode, "exit") || !strcmp(mode, "_exit") || !strcmp(mode, "raise")) {
        if (r == 1) {
            if (mode[0] == 'e')
                exit(0);
            if (mode[0] == '_')
                _exit(3);
            raise(SIGKILL);
        }
        wait_in_allreduce();
    } else if (!strcmp(mode, "hang")) {
        if (r == 1) {
            FILE *f = fopen(argc > 2 ? argv[2] : "t_fault.pid", "w");
            if (f) {
                fprintf(f, "%d\n", (int)getpid());
                fclose(f);
            }
            float x;
            rt_p2p_op op = { 0, &x, 1, RT_F32, 0, 0 };
            rt_p2p(&op, 1);
        }
        wait_in_allreduce();
    } else if (!strcmp(mode, "norecv") || !strcmp(mode, "norecv2")) {
        if (r == 0) {
            float *d = rt_malloc(10 * sizeof(float));
            rt_p2p_op op = { 0, d, 10, RT_F32, 1, 0 };
            if (mode[6]) {
                rt_wait(rt_p2p_start(&op, 1));
            } else {
                rt_p2p(&op, 1);
            }
        } else {
            sleep(30);
        }
    } else if (!strcmp(mode, "nowait")) {
        static const int dp[] = { 0, 1 };
        rt_group *g = rt_group_create("dp", dp, 2);
        float *d = rt_malloc(10 * sizeof(float));
        rt_req *q = rt_allreduce_start(d, 10, RT_F32, RT_SUM, g);
        if (r == 1)
            rt_wait(q);
    } else if (!strcmp(mode, "stuck")) {
        static const int tp[] = { 0, 1 };
        rt_group *g = rt_group_create("tp", tp, 2);
        if (r == 0) {
            float *d = rt_malloc(4);
            rt_allreduce(d, 1, RT_F32, RT_SUM, g);
        } else {
            sleep(30);
        }
    } else if (!strcmp(mode, "asyncstuck")) {
        static const int tp[] = { 0, 1 };
        rt_group *g = rt_group_create("tp", tp, 2);
        if (r == 0) {
            float *d = rt_malloc(100000 * sizeof(float));
            rt_req *q = rt_allreduce_start(d, 100000, RT_F32, RT_SUM, g);
            for (int i = 0; i < 100; i++)
                rt_progress();
            rt_wait(q);
        } else {
            sleep(30);
        }
    } else if (!strcmp(mode, "notmember")) {
        static const int embd[] = { 0 };
        rt_group_create("embd", embd, 1);
    } else if (!strcmp(mode, "nullgroup")) {
        static const int embd[] = { 0 };
        rt_group *g = rt_group_create("embd", r == 0 ? embd : NULL, r == 0 ? 1 : 0);
        float *d = rt_malloc(4);
        rt_allreduce(d, 1, RT_F32, RT_SUM, g);
    } else if (!strcmp(mode, "badtable")) {
        static const int tp[2] = { 0, 1 }, tp2[2] = { 1, 0 };
        rt_group_create("tp", r == 0 ? tp : tp2, 2);
    } else if (!strcmp(mode, "nofinalize")) {
        if (r == rt_world() - 1)
            return 0;
    }
    rt_finalize();
    return 0;
}
