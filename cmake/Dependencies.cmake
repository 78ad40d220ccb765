# Each dependency is found with find_package first (Debian/Ubuntu packages:
# libeigen3-dev libfmt-dev libcli11-dev libgtest-dev libbenchmark-dev); when a
# package is missing, a pinned release is fetched, so a user with internet needs
# no manual install.
include(FetchContent)
set(FETCHCONTENT_QUIET ON)

find_package(Eigen3 3.3 QUIET NO_MODULE)
if(NOT TARGET Eigen3::Eigen)
  message(STATUS "Eigen3 not installed: fetching 3.4.0")
  FetchContent_Declare(eigen
    URL https://gitlab.com/libeigen/eigen/-/archive/3.4.0/eigen-3.4.0.tar.gz)
  FetchContent_GetProperties(eigen)
  if(NOT eigen_POPULATED)
    FetchContent_Populate(eigen)
  endif()
  add_library(Eigen3::Eigen INTERFACE IMPORTED)
  set_target_properties(Eigen3::Eigen PROPERTIES INTERFACE_INCLUDE_DIRECTORIES ${eigen_SOURCE_DIR})
endif()

find_package(fmt 8 QUIET)
if(NOT TARGET fmt::fmt)
  message(STATUS "fmt not installed: fetching 10.2.1")
  FetchContent_Declare(fmt
    URL https://github.com/fmtlib/fmt/archive/refs/tags/10.2.1.tar.gz)
  FetchContent_MakeAvailable(fmt)
endif()

find_package(CLI11 2 QUIET)
if(NOT TARGET CLI11::CLI11)
  message(STATUS "CLI11 not installed: fetching 2.4.1")
  FetchContent_Declare(cli11
    URL https://github.com/CLIUtils/CLI11/archive/refs/tags/v2.4.1.tar.gz)
  FetchContent_MakeAvailable(cli11)
endif()

if(LLM_BUILD_TESTS)
  find_package(GTest QUIET)
  if(NOT TARGET GTest::gtest_main)
    message(STATUS "GoogleTest not installed: fetching 1.14.0")
    set(INSTALL_GTEST OFF CACHE BOOL "" FORCE)
    FetchContent_Declare(googletest
      URL https://github.com/google/googletest/archive/refs/tags/v1.14.0.tar.gz)
    FetchContent_MakeAvailable(googletest)
  endif()
endif()

if(LLM_BUILD_BENCHMARKS)
  find_package(benchmark QUIET)
  if(NOT TARGET benchmark::benchmark)
    message(STATUS "Google Benchmark not installed: fetching 1.8.3")
    set(BENCHMARK_ENABLE_TESTING OFF CACHE BOOL "" FORCE)
    set(BENCHMARK_ENABLE_GTEST_TESTS OFF CACHE BOOL "" FORCE)
    FetchContent_Declare(benchmark
      URL https://github.com/google/benchmark/archive/refs/tags/v1.8.3.tar.gz)
    FetchContent_MakeAvailable(benchmark)
  endif()
endif()

# Step 07's server and load client: cpp-httplib and nlohmann-json (Debian:
# libcpp-httplib-dev, nlohmann-json3-dev; step 06 reads llama-bench's JSON
# with the latter). Debian builds cpp-httplib as a
# shared library with its TLS/zlib/brotli options on; its pkg-config file
# carries the matching defines, so the header is read as the library was built.
find_package(Threads REQUIRED)
find_package(nlohmann_json 3.10 QUIET)
if(NOT TARGET nlohmann_json::nlohmann_json)
  message(STATUS "nlohmann-json not installed: fetching 3.11.2")
  FetchContent_Declare(nlohmann_json
    URL https://github.com/nlohmann/json/releases/download/v3.11.2/json.tar.xz)
  FetchContent_MakeAvailable(nlohmann_json)
endif()

find_package(PkgConfig QUIET)
if(PKG_CONFIG_FOUND)
  pkg_check_modules(CPP_HTTPLIB QUIET IMPORTED_TARGET cpp-httplib>=0.11)
endif()
add_library(llm_httplib INTERFACE)
if(TARGET PkgConfig::CPP_HTTPLIB)
  target_link_libraries(llm_httplib INTERFACE PkgConfig::CPP_HTTPLIB Threads::Threads)
else()
  # The upstream release is header-only (plain HTTP: no TLS needed on loopback).
  message(STATUS "cpp-httplib not installed: fetching 0.11.4")
  FetchContent_Declare(cpp_httplib
    URL https://github.com/yhirose/cpp-httplib/archive/refs/tags/v0.11.4.tar.gz)
  FetchContent_GetProperties(cpp_httplib)
  if(NOT cpp_httplib_POPULATED)
    FetchContent_Populate(cpp_httplib)
  endif()
  target_include_directories(llm_httplib INTERFACE ${cpp_httplib_SOURCE_DIR})
  target_link_libraries(llm_httplib INTERFACE Threads::Threads)
endif()
