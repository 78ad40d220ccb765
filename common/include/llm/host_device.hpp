#pragma once
// Functions that run on the host and, compiled by nvcc, in kernels too: the
// same arithmetic for both sides, tested on the CPU.
#if defined(__CUDACC__)
#define LLM_HOST_DEVICE __host__ __device__
#else
#define LLM_HOST_DEVICE
#endif
