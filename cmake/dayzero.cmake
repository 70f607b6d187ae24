# Shared build settings and the helper that turns one folder of src/dayzero into one library.

set(DZ_WARNINGS -Wall -Wextra -Wpedantic -Werror -Wshadow -Wconversion -Wno-sign-conversion)
if(CMAKE_CXX_COMPILER_ID MATCHES "Clang")
  # `#pragma omp simd` is a hint: under the sanitizers of the fuzz build clang cannot vectorize
  # some of those loops and says so, which is not a defect of the code.
  list(APPEND DZ_WARNINGS -Wno-pass-failed)
elseif(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
  # GCC 12 at -O3 (Release) reports `"literal" + std::string&&` as an overlapping memcpy: a known
  # false -Wrestrict of its std::string inlining, gone in GCC 13.
  list(APPEND DZ_WARNINGS -Wno-restrict)
endif()
set(DZ_ISA_FLAGS_avx512 -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512bf16 -mavx512vbmi -mfma -mf16c)
# oneDNN's own cap (ONEDNN_MAX_CPU_ISA) for the tests run at each lower DZ_CPU_ISA level: oneDNN's
# GEMMs dispatch on their own, so without it an AMX machine would still run oneDNN's AMX kernels.
set(DZ_ONEDNN_ISA_generic AVX2)
set(DZ_ONEDNN_ISA_avx512 AVX512_CORE_BF16)

if(DZ_SANITIZE)
  add_compile_options(-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all)
  add_link_options(-fsanitize=address,undefined)
endif()
if(DZ_TSAN)
  if(DZ_SANITIZE)
    message(FATAL_ERROR "DZ_TSAN and DZ_SANITIZE cannot be combined (TSan excludes ASan)")
  endif()
  add_compile_options(-fsanitize=thread -fno-omit-frame-pointer)
  add_link_options(-fsanitize=thread)
endif()

# dz_layer(NAME DEPS <libs...>) builds every *.cpp of the current folder (and its sub-folders) into
# the static library dz_NAME, except *_test.cpp, which become the GoogleTest program dz_NAME_tests,
# and *_mpitest.cpp (multi-rank tests, built by the layer's own CMakeLists).
# Files named *_avx512.cpp are compiled with the AVX-512 flags; nothing else is, so the reference
# code stays portable and the dispatcher (kernels/) decides at run time.
function(dz_layer name)
  cmake_parse_arguments(ARG "" "" "DEPS" ${ARGN})
  file(GLOB_RECURSE sources CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/*.cpp)
  set(tests ${sources})
  list(FILTER sources EXCLUDE REGEX "_test\\.cpp$")
  # *_mpitest.cpp are multi-rank GoogleTest programs the layer's own CMakeLists runs under mpirun.
  list(FILTER sources EXCLUDE REGEX "_mpitest\\.cpp$")
  list(FILTER tests INCLUDE REGEX "_test\\.cpp$")
  if(sources)
    add_library(dz_${name} STATIC ${sources})
    set_target_properties(dz_${name} PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE 8)
    target_include_directories(dz_${name} PUBLIC ${PROJECT_SOURCE_DIR}/src)
    target_compile_options(dz_${name} PRIVATE ${DZ_WARNINGS})
    target_link_libraries(dz_${name} PUBLIC ${ARG_DEPS})
    foreach(src IN LISTS sources)
      if(src MATCHES "_avx512\\.cpp$")
        set_source_files_properties(${src} PROPERTIES COMPILE_OPTIONS "${DZ_ISA_FLAGS_avx512}")
      endif()
    endforeach()
  else()
    add_library(dz_${name} INTERFACE)
    target_link_libraries(dz_${name} INTERFACE ${ARG_DEPS})
  endif()
  if(tests AND NOT DZ_FUZZ)
    add_executable(dz_${name}_tests ${tests})
    # Test files compiled in batches (one translation unit per batch): GoogleTest and the other
    # headers are parsed once per batch, not once per file. Each file keeps its tests in a
    # namespace of its own (CI time).
    set_target_properties(dz_${name}_tests PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE 8)
    target_compile_options(dz_${name}_tests PRIVATE ${DZ_WARNINGS})
    target_compile_definitions(dz_${name}_tests PRIVATE
      DZ_SOURCE_DIR="${PROJECT_SOURCE_DIR}" DZ_BUILD_DIR="${PROJECT_BINARY_DIR}")
    target_link_libraries(dz_${name}_tests PRIVATE dz_${name} GTest::gtest GTest::gmock GTest::gtest_main)
    # Listing the tests of a sanitizer build on a loaded 2-core machine took longer than the
    # default 5 s once (an error, not a failure of any test).
    gtest_discover_tests(dz_${name}_tests DISCOVERY_MODE PRE_TEST DISCOVERY_TIMEOUT 60
      PROPERTIES LABELS "unit")
  endif()
endfunction()

# dz_add_mpi_test(NAME RANKS COMMAND...) runs COMMAND under mpirun with RANKS ranks on this machine
# (shared memory transport, no binding, more ranks than cores allowed), one OpenMP thread each.
# Labelled "mpi": not part of the sanitizer runs (`-L unit`).
set(DZ_MPIRUN_FLAGS --oversubscribe --bind-to none --mca btl self,vader
    --mca btl_vader_single_copy_mechanism none -x OMP_NUM_THREADS=1)
function(dz_add_mpi_test name ranks)
  add_test(NAME ${name} COMMAND ${MPIEXEC_EXECUTABLE} -np ${ranks} ${DZ_MPIRUN_FLAGS} ${ARGN})
  set_tests_properties(${name} PROPERTIES LABELS "mpi" TIMEOUT 300
    ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMP_NUM_THREADS=1")
endfunction()
