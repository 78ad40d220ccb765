#include "step02_flash_attention/kernel_image.hpp"

#include <fmt/format.h>

namespace step02 {

std::string tensor_core_unavailable(const std::string& what, int needed, KernelImage image, int device_cc) {
  if (device_cc < needed) return fmt::format("{} needs sm_{}+; this GPU is sm_{}", what, needed, device_cc);
  if (image.binary_version <= 0 && image.ptx_version <= 0)
    return fmt::format("this build holds no kernel image this GPU (sm_{}) can run; rebuild with "
                       "-DCMAKE_CUDA_ARCHITECTURES={} (or native)",
                       device_cc, device_cc);
  // The code's architecture is the PTX it came from (0 only for cubins older
  // than CUDA 3.0, where the SASS version is all there is).
  const int compiled_for = image.ptx_version > 0 ? image.ptx_version : image.binary_version;
  if (compiled_for < needed)
    return fmt::format("{} needs code compiled for sm_{}+; this build's kernel was compiled for compute_{} "
                       "(this sm_{} GPU runs it JIT-compiled from that PTX, which has no such mma); rebuild with "
                       "-DCMAKE_CUDA_ARCHITECTURES including {} (or native)",
                       what, needed, compiled_for, device_cc, device_cc);
  return "";
}

}  // namespace step02
