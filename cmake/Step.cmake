# llm_step_cuda_options(<target>): how a step's .cu files are compiled (also
# used by tests/CMakeLists.txt to compile one again with spills as errors).
# -lineinfo: profilers (Nsight Compute) map instructions back to source lines.
function(llm_step_cuda_options target)
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr -lineinfo>)
endfunction()

# llm_command_line_code(<source>...): sources that are command-line code, a
# step's main.cpp and the harness that parses its flags: CLI11 (all in
# headers) and printing, never what a step times (that runs in the
# libraries, which keep the build's optimization). They compile at -O1, and
# at -O0 in the sanitizer tier as the test suites' own code does
# (LLM_UNOPTIMIZED_TEST_SUITES): a step's main then takes about a third less
# time to compile at -O1 than at -O3 with g++, and half as long at -O0 under
# clang's sanitizers. The last -O on the command line wins.
function(llm_command_line_code)
  if(LLM_UNOPTIMIZED_TEST_SUITES)
    set_source_files_properties(${ARGN} PROPERTIES COMPILE_OPTIONS -O0)
  else()
    set_source_files_properties(${ARGN} PROPERTIES COMPILE_OPTIONS $<$<NOT:$<CONFIG:Debug>>:-O1>)
  endif()
endfunction()

# llm_add_step(<step> SOURCES ... [CUDA_SOURCES ...] [NO_CUDA_SOURCES ...] [LINK ...])
#
# Every step folder builds the same three things from its own sources:
#   <step>_lib    the step's code (linked by its executable, its benchmark,
#                 tests/<step>_*_test.cpp, and by later steps that build on it)
#   <step>        measure/main.cpp: the executable that prints the step's table
#   <step>_bench  measure/bench.cpp: the Google Benchmark (when LLM_BUILD_BENCHMARKS)
# CUDA_SOURCES join the library when the build has CUDA; NO_CUDA_SOURCES (the
# same entry points, reporting "built without CUDA") when it has not.
function(llm_add_step name)
  cmake_parse_arguments(STEP "" "" "SOURCES;CUDA_SOURCES;NO_CUDA_SOURCES;LINK" ${ARGN})
  set(lib ${name}_lib)
  add_library(${lib} STATIC ${STEP_SOURCES})
  # The repository root, not the step folder: step headers are included with
  # their folder's name ("step02_flash_attention/variants.hpp"), so two steps'
  # variants.hpp never collide when one step links another's library.
  target_include_directories(${lib} PUBLIC ${PROJECT_SOURCE_DIR})
  target_link_libraries(${lib} PUBLIC llm_common ${STEP_LINK})
  # The library's measurement code (its measure/ sources: the parts that run
  # and print the step's tables) is the sanitizer tier's to check, not to
  # time: -O0 there, as the suites' own code, so that it compiles in less
  # time. Every other build keeps the build's level: some of it holds what
  # a part times (step 06's CPU bandwidth probe).
  if(LLM_UNOPTIMIZED_TEST_SUITES)
    set(measurement_sources ${STEP_SOURCES} ${STEP_NO_CUDA_SOURCES})
    list(FILTER measurement_sources INCLUDE REGEX "^measure/")
    set_source_files_properties(${measurement_sources} PROPERTIES COMPILE_OPTIONS -O0)
  endif()
  llm_enable_warnings(${lib})  # cmake/Warnings.cmake
  if(LLM_WITH_CUDA AND STEP_CUDA_SOURCES)
    target_sources(${lib} PRIVATE ${STEP_CUDA_SOURCES})
    llm_step_cuda_options(${lib})
  elseif(NOT LLM_WITH_CUDA AND STEP_NO_CUDA_SOURCES)
    target_sources(${lib} PRIVATE ${STEP_NO_CUDA_SOURCES})
  endif()

  # The executable and the benchmark are measurement: they live in the step's
  # measure/ folder, beside the idea's files at the step's top level.
  set(measure_dir ${CMAKE_CURRENT_SOURCE_DIR}/measure)
  if(NOT EXISTS ${measure_dir}/main.cpp)
    set(measure_dir ${CMAKE_CURRENT_SOURCE_DIR})  # a step not yet laid out (transitional)
  endif()
  add_executable(${name} ${measure_dir}/main.cpp)
  target_link_libraries(${name} PRIVATE ${lib})
  llm_command_line_code(${measure_dir}/main.cpp)

  if(LLM_BUILD_BENCHMARKS)
    add_executable(${name}_bench ${measure_dir}/bench.cpp)
    target_link_libraries(${name}_bench PRIVATE ${lib} benchmark::benchmark)
  endif()
endfunction()
