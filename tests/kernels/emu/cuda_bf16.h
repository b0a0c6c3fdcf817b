/* tests/kernels/emu/cuda_bf16.h: bf16 of the CUDA emulation (cuda_runtime.h) */
#include "cuda_runtime.h"
