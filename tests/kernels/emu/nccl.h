/* tests/kernels/emu/nccl.h: NCCL in the CUDA emulation (cuda_libs.cc): declared so that
** runtime/rt_cuda.cu compiles; a single-rank program never calls it (a group of one rank has
** no communicator), and every call fails with ncclInvalidUsage, naming itself. */
#ifndef GPT_CUDA_EMU_NCCL_H
#define GPT_CUDA_EMU_NCCL_H
#include "cuda_runtime.h"

typedef struct emu_nccl *ncclComm_t;
typedef struct { char internal[128]; } ncclUniqueId;
typedef enum { ncclSuccess = 0, ncclInvalidUsage = 5, ncclInProgress = 7 } ncclResult_t;
typedef enum { ncclInt32 = 2, ncclInt64 = 4, ncclFloat32 = 7, ncclBfloat16 = 9 } ncclDataType_t;
typedef enum { ncclSum = 0, ncclMax = 3 } ncclRedOp_t;

ncclResult_t ncclGetUniqueId(ncclUniqueId *id);
ncclResult_t ncclCommInitRank(ncclComm_t *c, int n, ncclUniqueId id, int rank);
ncclResult_t ncclCommDestroy(ncclComm_t c);
ncclResult_t ncclCommAbort(ncclComm_t c);
ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t *r);
const char *ncclGetErrorString(ncclResult_t r);
const char *ncclGetLastError(ncclComm_t c);
ncclResult_t ncclGroupStart(void);
ncclResult_t ncclGroupEnd(void);
ncclResult_t ncclAllReduce(const void *s, void *r, size_t n, ncclDataType_t t, ncclRedOp_t op,
                           ncclComm_t c, cudaStream_t st);
ncclResult_t ncclAllGather(const void *s, void *r, size_t n, ncclDataType_t t, ncclComm_t c,
                           cudaStream_t st);
ncclResult_t ncclReduceScatter(const void *s, void *r, size_t n, ncclDataType_t t,
                               ncclRedOp_t op, ncclComm_t c, cudaStream_t st);
ncclResult_t ncclBroadcast(const void *s, void *r, size_t n, ncclDataType_t t, int root,
                           ncclComm_t c, cudaStream_t st);
ncclResult_t ncclSend(const void *s, size_t n, ncclDataType_t t, int peer, ncclComm_t c,
                      cudaStream_t st);
ncclResult_t ncclRecv(void *r, size_t n, ncclDataType_t t, int peer, ncclComm_t c,
                      cudaStream_t st);
#endif
