/*
** stcmp.c: compare two safetensors files tensor by tensor (tests/parallel, tests/regions).
** Not a general tool: it reads both files with the reference's reader (build/ref/libref.a,
** tests/ref/ref_io.h), so it shares no code with the generated programs it checks.
**   stcmp A.safetensors B.safetensors [--rtol R] [--atol A] [--outliers F --hard H] [--exact]
** Both files must hold the same tensor names with the same shapes. An element is close when
** |a - b| <= atol + rtol*|b|. With --outliers F, up to a fraction F of all elements may be
** farther (outliers), as long as each stays within hard + rtol*|b|; without it every element
** must be close. --exact: a == b bit for bit (after widening to double). Prints the first 5
** mismatches and one summary line (elements, outliers, max abs diff and its tensor), and exits
** 0 (pass), 1 (mismatch) or 2 (unreadable files / different tensor sets).
*/
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ref_io.h"   // defines: ref_st_open, ref_st_find, ref_st_read, ref_st_numel

static int usage(void)
{
    fprintf(stderr, "usage: stcmp A.safetensors B.safetensors [--rtol R] [--atol A] "
            "[--outliers F --hard H] [--exact]\n");
    return 2;
}

int main(int argc, char **argv)
{
    double rtol = 0.0, atol = 0.0, outliers = 0.0, hard = 0.0;
    int exact = 0;
    const char *pa = NULL, *pb = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--rtol") && i + 1 < argc) rtol = atof(argv[++i]);
        else if (!strcmp(argv[i], "--atol") && i + 1 < argc) atol = atof(argv[++i]);
        else if (!strcmp(argv[i], "--outliers") && i + 1 < argc) outliers = atof(argv[++i]);
        else if (!strcmp(argv[i], "--hard") && i + 1 < argc) hard = atof(argv[++i]);
        else if (!strcmp(argv[i], "--exact")) exact = 1;
        else if (!pa) pa = argv[i];
        else if (!pb) pb = argv[i];
        else return usage();
    }
    if (!pa || !pb) return usage();
    ref_st_file fa, fb;
    if (ref_st_open(&fa, pa) || ref_st_open(&fb, pb)) return 2;
    if (fa.ntensors != fb.ntensors) {
        printf("stcmp: %s has %d tensors, %s has %d\n", pa, fa.ntensors, pb, fb.ntensors);
        return 2;
    }
    double max_abs = 0.0;
    const char *worst = "-";
    long far = 0, bad = 0, total = 0;   /* beyond atol; beyond what is allowed */
    for (int t = 0; t < fa.ntensors; t++) {
        const ref_st_tensor *ta = &fa.tensors[t], *tb = ref_st_find(&fb, ta->name);
        if (!tb || tb->ndim != ta->ndim ||
            memcmp(tb->shape, ta->shape, sizeof(long) * (size_t)ta->ndim)) {
            printf("stcmp: tensor '%s' is missing from %s or has another shape\n", ta->name, pb);
            return 2;
        }
        size_t n = ref_st_numel(ta);
        double *a = malloc(n * sizeof(double)), *b = malloc(n * sizeof(double));
        if (!a || !b || ref_st_read(&fa, ta, a) || ref_st_read(&fb, tb, b)) return 2;
        for (size_t i = 0; i < n; i++) {
            double d = fabs(a[i] - b[i]);
            int close = exact ? a[i] == b[i] : d <= atol + rtol * fabs(b[i]);
            int ok = close || (outliers > 0 && d <= hard + rtol * fabs(b[i]));
            if (d > max_abs) { max_abs = d; worst = ta->name; }
            far += !close;
            if (!ok && bad++ < 5)
                printf("  mismatch %s[%zu]: %.9g vs %.9g (diff %.3g)\n", ta->name, i, a[i], b[i],
                       d);
        }
        total += (long)n;
        free(a);
        free(b);
    }
    int too_many = far > outliers * (double)total;
    printf("stcmp: %ld elements, %ld beyond atol %.3g + rtol %.3g (allowed %.0f), %ld beyond "
           "%s; max abs diff %.3g (%s)\n", total, far, atol, rtol, outliers * (double)total, bad,
           outliers > 0 ? "hard" : "atol", max_abs, worst);
    ref_st_close(&fa);
    ref_st_close(&fb);
    return bad || too_many ? 1 : 0;
}
