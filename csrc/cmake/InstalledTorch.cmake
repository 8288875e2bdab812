# Locates the PyTorch installed for ${Python_EXECUTABLE} and describes it as an imported target
# `gpuopt::torch` (headers + libtorch/libc10 [+ CUDA parts]) and `gpuopt::torch_python`.
#
# Deliberately not find_package(Torch): its FindCUDA path fails when torch is a CUDA build but no
# full toolkit is present (BUILD.md), forces its own CUDA architecture list, and leaves NOTFOUND
# entries in TORCH_LIBRARIES on pip-installed CUDA runtimes. We need only headers, libraries and
# three facts (version, CUDA version, C++ ABI), which the interpreter tells us directly.

set(_gpuopt_torch_probe [=[
import sys
try:
    import torch
    from torch.utils import cpp_extension
except Exception as exc:  # noqa: BLE001 - any failure means "no usable torch"
    print("error=" + repr(exc).replace(";", ","))
    sys.exit(0)
import os, re
root = os.path.dirname(torch.__file__)
std = "17"
cfg = os.path.join(root, "share", "cmake", "Torch", "TorchConfig.cmake")
if os.path.exists(cfg):
    m = re.search(r"CXX_STANDARD\s+(\d+)", open(cfg).read())
    if m:
        std = m.group(1)
print("version=" + torch.__version__)
print("cuda=" + (torch.version.cuda or ""))
print("abi=" + str(int(torch._C._GLIBCXX_USE_CXX11_ABI)))
print("cxx_std=" + std)
print("include=" + ";".join(cpp_extension.include_paths()))
print("libdir=" + os.path.join(root, "lib"))
]=])

execute_process(
  COMMAND "${Python_EXECUTABLE}" -c "${_gpuopt_torch_probe}"
  OUTPUT_VARIABLE _probe_out
  ERROR_VARIABLE _probe_err
  RESULT_VARIABLE _probe_rc)

if(NOT _probe_rc EQUAL 0 OR _probe_out STREQUAL "" OR _probe_out MATCHES "(^|\n)error=")
  string(REGEX MATCH "error=[^\n]*" _why "${_probe_out}")
  message(FATAL_ERROR
    "gpuopt compiles against the PyTorch you already have, and ${Python_EXECUTABLE} cannot import "
    "torch (${_why}${_probe_err}). Install torch first (https://pytorch.org/get-started), then "
    "build with: pip install --no-build-isolation .  (plain `pip install .` hides your torch "
    "from the build)")
endif()

string(REPLACE "\n" ";" _probe_lines "${_probe_out}")
foreach(_line IN LISTS _probe_lines)
  if(_line MATCHES "^([a-z_]+)=(.*)$")
    set(_torch_${CMAKE_MATCH_1} "${CMAKE_MATCH_2}")
  endif()
endforeach()
# include= holds a ';'-separated list that the line split above flattened; recover it.
string(REGEX MATCH "include=([^\n]*)" _m "${_probe_out}")
set(_torch_include "${CMAKE_MATCH_1}")

set(GPUOPT_TORCH_VERSION "${_torch_version}")
set(GPUOPT_TORCH_CUDA "${_torch_cuda}")
set(GPUOPT_TORCH_CXX_STANDARD "${_torch_cxx_std}")
set(GPUOPT_TORCH_CXX11_ABI "${_torch_abi}")
message(STATUS "gpuopt: torch ${GPUOPT_TORCH_VERSION} (CUDA '${GPUOPT_TORCH_CUDA}', "
               "C++${GPUOPT_TORCH_CXX_STANDARD}, CXX11 ABI ${_torch_abi}) at ${_torch_libdir}")

function(_gpuopt_torch_lib out name)
  find_library(_lib_${name} NAMES ${name} PATHS "${_torch_libdir}" NO_DEFAULT_PATH)
  if(NOT _lib_${name})
    message(FATAL_ERROR "gpuopt: lib${name} not found in ${_torch_libdir}; is this torch install complete?")
  endif()
  set(${out} "${_lib_${name}}" PARENT_SCOPE)
endfunction()

_gpuopt_torch_lib(_c10 c10)
_gpuopt_torch_lib(_torch torch)
_gpuopt_torch_lib(_torch_cpu torch_cpu)
_gpuopt_torch_lib(_torch_python torch_python)
set(_torch_libs "${_torch}" "${_torch_cpu}" "${_c10}")
if(NOT GPUOPT_TORCH_CUDA STREQUAL "")
  _gpuopt_torch_lib(_c10_cuda c10_cuda)
  _gpuopt_torch_lib(_torch_cuda torch_cuda)
  list(APPEND _torch_libs "${_torch_cuda}" "${_c10_cuda}")
endif()

add_library(gpuopt::torch INTERFACE IMPORTED)
target_include_directories(gpuopt::torch SYSTEM INTERFACE ${_torch_include})
target_link_libraries(gpuopt::torch INTERFACE ${_torch_libs})
target_compile_definitions(gpuopt::torch INTERFACE _GLIBCXX_USE_CXX11_ABI=${_torch_abi})

add_library(gpuopt::torch_python INTERFACE IMPORTED)
target_link_libraries(gpuopt::torch_python INTERFACE "${_torch_python}" gpuopt::torch)
