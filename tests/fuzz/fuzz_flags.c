/*
** fuzz_flags.c: harness for the training program's command line (lib/flags.c,
** lib_flags_parse). The input is the argument list, words separated by NUL bytes (argv[0] is
** "train"). A usage error (lib_fail_all) is a normal outcome; an accepted command line must
** satisfy the checks the parser promises.
*/
#include <stdlib.h>
#include <string.h>

#include "flags.h"     // defines: lib_flags, lib_flags_parse
#include "fuzz.h"      // defines: LLVMFuzzerTestOneInput, fz_bug
#include "libstub.h"   // defines: FZ_TRY, fz_msg

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static char *argv[FZ_MAX_ARGS + 1];
    char *text;
    int argc = fz_argv(data, size, "train", argv, &text);
    static lib_flags f;
    int r = FZ_TRY();
    if (r == FZ_OK) {
        lib_flags_parse(argc, argv, &f);
        if (!f.help) {
            if (!(f.min_lr >= 0 && f.min_lr <= f.lr && f.lr_init <= f.lr))
                fz_bug("accepted lr %g, min-lr %g, warm-up init %g", f.lr, f.min_lr, f.lr_init);
            if (f.decay_steps < f.warmup || f.beta1 < 0 || f.beta1 >= 1 || f.beta2 < 0 ||
                f.beta2 >= 1)
                fz_bug("accepted decay-steps %d < warmup %d or a beta outside [0, 1)",
                       f.decay_steps, f.warmup);
            if (f.steps > 0 && !f.data && !f.ndata_path && !f.show_groups)
                fz_bug("accepted training with no data");
            if (f.data_path && (f.data_path < argv || f.data_path + f.ndata_path > argv + argc))
                fz_bug("--data-path's words are not inside argv");
        }
    } else if (r == FZ_INTERNAL) {
        fz_bug("an internal check failed in the flag parser: %s", fz_msg);
    }
    free(text);
    return 0;
}
