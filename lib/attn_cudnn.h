/*
** attn_cudnn.h: causal attention of whole sequences in bf16 on cuDNN's fused attention
** (attn_cudnn.cu), for kernels_cuda.cu's attention_fwd and attention_bwd: the same operands
** and results as theirs (kernels.h). Each returns 1 where cuDNN ran the call, 0 where the
** caller's own kernels must (ATTN=own, cuDNN not loaded, a shape it refuses, an operand not
** 16-byte aligned). With ATTN=cudnn a refusal ends the job instead.
*/
#ifndef GPT_ATTN_CUDNN_H
#define GPT_ATTN_CUDNN_H

int cudnn_attention_fwd(void *out, float *lse, const void *qkv, int B, int T, int Hl, int KVl,
                        int hd, float scale);
int cudnn_attention_bwd(void *dqkv, float *dsum, const void *dout, const void *out,
                        const float *lse, const void *qkv, int B, int T, int Hl, int KVl,
                        int hd, float scale);

#endif
