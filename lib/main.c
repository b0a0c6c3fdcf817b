/*
** main.c: the entry point of every generated training program. The program's own sources
** define its description (program.c: gpt_program_desc); this hands it to the library. Kept
** apart so that test programs can link a program's tables and the library with a main of
** their own (the archive member is only pulled in when main is undefined).
*/
#include "gpt.h"

int main(int argc, char **argv)
{
    return gpt_main(argc, argv, &gpt_program_desc);
}
