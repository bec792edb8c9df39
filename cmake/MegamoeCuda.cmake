# Shared CUDA settings for the three packages.
#  - sm_90a only (wgmma, setmaxnreg need the arch-specific target);
#  - CUDA runtime linked statically so a library built here runs on any x86-64 Linux + driver;
#  - ptxas -v output of every object kept under <build>/ptxas/, and a spill or local-memory use is
#    a hard error (ptxas warnings are promoted to errors).
include(CheckLanguage)
set(MEGAMOE_CMAKE_DIR "${CMAKE_CURRENT_LIST_DIR}")
# Headers every package includes (the one PTX wrapper layer): packages/common/include/moe_common/.
set(MEGAMOE_COMMON_INCLUDE "${CMAKE_CURRENT_LIST_DIR}/../packages/common/include")

set(MEGAMOE_MIN_NVCC "12.8" CACHE STRING "oldest nvcc that can build the sm_90a kernels")
option(MEGAMOE_REQUIRE_CUDA "fail the configure step when nvcc is missing or too old" OFF)

macro(megamoe_find_cuda out_var)
  set(${out_var} OFF)
  if(DEFINED ENV{MEGAMOE_SKIP_CUDA} AND "$ENV{MEGAMOE_SKIP_CUDA}")
    message(STATUS "megamoe: MEGAMOE_SKIP_CUDA set, building no CUDA code")
  else()
    check_language(CUDA)
    if(CMAKE_CUDA_COMPILER)
      set(CMAKE_CUDA_ARCHITECTURES OFF)
      set(CMAKE_CUDA_RUNTIME_LIBRARY Static)
      set(CMAKE_CUDA_COMPILER_LAUNCHER "${MEGAMOE_CMAKE_DIR}/ptxas_log.sh;${CMAKE_BINARY_DIR}/ptxas")
      enable_language(CUDA)
      if(CMAKE_CUDA_COMPILER_VERSION VERSION_LESS MEGAMOE_MIN_NVCC)
        message(WARNING "megamoe: nvcc ${CMAKE_CUDA_COMPILER_VERSION} < ${MEGAMOE_MIN_NVCC}; CUDA kernels are NOT built")
      else()
        set(${out_var} ON)
        message(STATUS "megamoe: building CUDA kernels with nvcc ${CMAKE_CUDA_COMPILER_VERSION} for sm_90a")
      endif()
    else()
      message(WARNING "megamoe: no nvcc found; CUDA kernels are NOT built (pure-Python parts still work)")
    endif()
  endif()
  if(MEGAMOE_REQUIRE_CUDA AND NOT ${out_var})
    message(FATAL_ERROR "megamoe: MEGAMOE_REQUIRE_CUDA=ON but no usable nvcc (>= ${MEGAMOE_MIN_NVCC}) was found")
  endif()
endmacro()

# megamoe_cuda_library(<name> SOURCES ... INCLUDES ... [LINK ...] [SPILLS_ALLOWED])
# SPILLS_ALLOWED: ptxas spills are reported (build/ptxas/) but not an error. Only libmegamoe uses it,
# while its fused kernel still spills (docs/perf-notes.md "fused kernel": a known defect, not a policy).
# Builds lib<name>.so from .cu sources, exports only the C ABI, installs it (and the package's
# headers) into the Python package <name>/ when MEGAMOE_INSTALL_PYTHON is on.
function(megamoe_cuda_library name)
  cmake_parse_arguments(ARG "SPILLS_ALLOWED" "" "SOURCES;INCLUDES;LINK" ${ARGN})
  if(ARG_SPILLS_ALLOWED)
    set(_ptxas_flags "-Xptxas=-v,--warn-on-spills,--warn-on-local-memory-usage")
  else()
    set(_ptxas_flags "-Xptxas=-v,--warn-on-spills,--warn-on-local-memory-usage,--warning-as-error")
  endif()
  add_library(${name} SHARED ${ARG_SOURCES})
  target_include_directories(${name} PUBLIC ${ARG_INCLUDES})
  target_compile_options(${name} PRIVATE
    $<$<COMPILE_LANGUAGE:CUDA>:-gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17
      --expt-relaxed-constexpr -lineinfo
      ${_ptxas_flags}
      -Xcompiler=-fvisibility=hidden>)
  target_link_libraries(${name} PRIVATE ${ARG_LINK})
  set_target_properties(${name} PROPERTIES
    CUDA_SEPARABLE_COMPILATION OFF
    LIBRARY_OUTPUT_DIRECTORY "${CMAKE_BINARY_DIR}/lib"
    CXX_VISIBILITY_PRESET hidden CUDA_VISIBILITY_PRESET hidden)
  if(MEGAMOE_INSTALL_PYTHON)
    install(TARGETS ${name} LIBRARY DESTINATION ${name})
  endif()
endfunction()

function(megamoe_install_headers pkg)
  if(MEGAMOE_INSTALL_PYTHON AND EXISTS "${CMAKE_CURRENT_SOURCE_DIR}/include")
    install(DIRECTORY "${CMAKE_CURRENT_SOURCE_DIR}/include/" DESTINATION ${pkg}/include)
    # the common headers beside each package's own, so <pkg>/include alone is a complete include path
    install(DIRECTORY "${MEGAMOE_COMMON_INCLUDE}/" DESTINATION ${pkg}/include)
  endif()
endfunction()
