/*
** flags_doc.c: prints README.md's table of the training program's flags from the table
** LIB_FLAGS (lib/flags.h, lib_flags_markdown), for `make readme-flags`, which writes it into
** README.md, and for tests/train, which checks that README.md holds it. Not part of the
** library: build/lib/flags_doc, linked with it.
*/
#include <stdio.h>

#include "flags.h"    // defines: lib_flags_markdown

int main(void)
{
    lib_flags_markdown(stdout);
    return ferror(stdout) || fflush(stdout) ? 1 : 0;
}
