# CUDA is optional. LLM_CUDA=AUTO turns it on when a CUDA compiler is found;
# ON makes its absence an error; OFF builds the CPU course only.
set(LLM_CUDA AUTO CACHE STRING "Build the CUDA code: AUTO, ON or OFF")
set_property(CACHE LLM_CUDA PROPERTY STRINGS AUTO ON OFF)

set(LLM_WITH_CUDA OFF)
if(NOT LLM_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(LLM_WITH_CUDA ON)
  elseif(LLM_CUDA STREQUAL "ON")
    message(FATAL_ERROR "LLM_CUDA=ON but no CUDA compiler was found (set CMAKE_CUDA_COMPILER)")
  endif()
endif()

if(LLM_WITH_CUDA)
  # Architectures: the user's choice wins (-DCMAKE_CUDA_ARCHITECTURES, or the
  # CUDAARCHS environment variable CMake itself reads). Otherwise 'native' when
  # a GPU is visible now (fast compile, exact fit), else a list for T4 (75),
  # A100 (80) and H100 (90) so a build without a GPU compiles every kernel for
  # the cards we support.
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES AND DEFINED ENV{CUDAARCHS})
    set(CMAKE_CUDA_ARCHITECTURES "$ENV{CUDAARCHS}" CACHE STRING "CUDA architectures")
  endif()
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(_llm_have_gpu OFF)
    find_program(_llm_nvidia_smi nvidia-smi)
    if(_llm_nvidia_smi)
      execute_process(COMMAND ${_llm_nvidia_smi} -L RESULT_VARIABLE _smi_rc OUTPUT_VARIABLE _smi_out ERROR_QUIET)
      if(_smi_rc EQUAL 0 AND _smi_out MATCHES "GPU")
        set(_llm_have_gpu ON)
      endif()
    endif()
    if(_llm_have_gpu)
      set(CMAKE_CUDA_ARCHITECTURES native CACHE STRING "CUDA architectures")
    else()
      set(CMAKE_CUDA_ARCHITECTURES "75;80;90" CACHE STRING "CUDA architectures")
    endif()
  endif()
  enable_language(CUDA)
  if(CMAKE_VERSION VERSION_LESS 3.25.2)
    # CMake learned nvcc's C++20 flag in 3.25.2; older ones (Debian 12 ships
    # 3.25.1) stop at generate time with "requires the language dialect
    # CUDA20". Tell them the flag (nvcc accepts it from CUDA 12 on).
    set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
  endif()
  set(CMAKE_CUDA_STANDARD 20)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  # Every CUDA target: ptxas warns when a kernel spills registers or uses
  # local memory (a stack array it could not keep in registers), for each
  # architecture it compiles. Both cost global-memory traffic the kernels'
  # bytes-read arithmetic does not count; a build shows none.
  add_compile_options("$<$<COMPILE_LANGUAGE:CUDA>:SHELL:-Xptxas -warn-spills>"
                      "$<$<COMPILE_LANGUAGE:CUDA>:SHELL:-Xptxas -warn-lmem-usage>")
  find_package(CUDAToolkit REQUIRED)
  if(LLM_STATIC_CUDART)
    set(LLM_CUDART CUDA::cudart_static)
  else()
    set(LLM_CUDART CUDA::cudart)
  endif()
endif()
