/*
** tests/pipeline/slot_bytes.c: bytes of one activation slot of a one-layer chunk, as the
** generated program allocates them. Linked with the generated model.o and -Wl,--wrap=rt_malloc,
** it counts what layer_acts_alloc (model.c.tmpl) requests and adds the chunk's input and
** gradient (N_SP x C floats each, as stage.c.tmpl's alloc_chunk_acts). tests/pipeline/suite.sh
** compares the number with inspect.slot_bytes (what make inspect reports).
*/
#include <stdio.h>
#include "model.h"

void *__real_rt_malloc(size_t bytes);
void *__wrap_rt_malloc(size_t bytes);

static size_t counted;

void *__wrap_rt_malloc(size_t bytes)
{
    counted += bytes;
    return __real_rt_malloc(bytes);
}

int main(void)
{
    layer_acts a;
    layer_acts_alloc(&a);
    size_t chunk_io = 2 * (size_t)CFG_N_SP * CFG_C * sizeof(float);   /* x, dy */
    printf("%zu\n", counted + chunk_io);
    return 0;
}
