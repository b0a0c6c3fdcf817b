/*
** rt_launch.h: how the CUDA sources (runtime/rt_cuda.cu, lib/kernels_cuda.cu) write a kernel
** launch and dynamic shared memory, so that the CPU emulation of CUDA used by the tests
** (tests/kernels/emu, compiled with -DGPT_CUDA_EMU) can run the same source:
**   KERNEL_LAUNCH(grid, block, smem, kernel)(args)   for   kernel<<<grid, block, smem>>>(args)
**   DYN_SHARED(type, name);                          for   extern __shared__ type name[]
**                                                    (aligned to 128 bytes: 16-byte vectors)
** Under the emulation its cuda_runtime.h defines both.
*/
#ifndef RT_LAUNCH_H
#define RT_LAUNCH_H

#ifndef GPT_CUDA_EMU
#define KERNEL_LAUNCH(grid, block, smem, ...) __VA_ARGS__<<<(grid), (block), (smem)>>>
#define DYN_SHARED(type, name) extern __shared__ __align__(128) type name[]
#endif

#endif
