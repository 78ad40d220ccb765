#pragma once
// Which tensor-core rows (variants 4 and 5) this build can run on this GPU.
//
// The card's compute capability is not enough. A build for compute_75 only
// (CMAKE_CUDA_ARCHITECTURES=75) still runs on an sm_90 card: the driver
// JIT-compiles its compute_75 PTX, in which __CUDA_ARCH__ is 750, so the bf16
// kernel holds no bf16 mma (v4_v5_cuda_flash2_mma.cu compiles it to a trap
// below sm_80). What decides is the architecture the kernel's code was
// compiled for, which cudaFuncGetAttributes reports for the kernel itself.
// Plain C++, no CUDA types: the CPU tests check the decision with made-up
// attribute values.
#include <string>

namespace step02 {

// cudaFuncAttributes of one kernel on the current GPU, as 75 / 80 / 90.
struct KernelImage {
  int ptx_version = 0;     // ptxVersion: the virtual architecture (compute_XY) its code was compiled for,
                           // i.e. the __CUDA_ARCH__ it saw; 0 when unknown
  int binary_version = 0;  // binaryVersion: the SASS it runs as here (above ptx_version when the
                           // driver JIT-compiled the PTX); 0 when the build holds no image for this GPU
};

// "" when a kernel whose tensor-core mma (`what`, e.g. "bf16 tensor-core
// mma") needs code compiled for `needed` (75, 80) runs with it on a GPU of
// compute capability `device_cc`, given the kernel's `image`; else why not,
// in words that say what to change.
std::string tensor_core_unavailable(const std::string& what, int needed, KernelImage image, int device_cc);

}  // namespace step02
