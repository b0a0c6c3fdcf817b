/* tests/kernels/emu/mma.h: the warp matrix operations of the CUDA emulation (cuda_runtime.h) */
#include "cuda_runtime.h"
