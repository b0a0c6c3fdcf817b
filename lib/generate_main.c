/*
** generate_main.c: the entry point of every generated directory's generate program: the
** program's description (program.c: gpt_program_desc) to the library's gpt_generate. Linked
** as an object of its own, not from the library's archive (which holds train's main.c).
*/
#include "generate.h"

int main(int argc, char **argv)
{
    return gpt_generate(argc, argv, &gpt_program_desc);
}
