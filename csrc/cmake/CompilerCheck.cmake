# Refuses a GCC whose libstdc++ exists only as a private static copy (BUILD.md pitfall 1): a Python
# module linked with it carries its own libstdc++ next to torch's and crashes the first time it
# formats a number into an error message. Such a GCC answers `-print-file-name=libstdc++.so` with the
# bare name instead of an absolute path.
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
  execute_process(
    COMMAND "${CMAKE_CXX_COMPILER}" -print-file-name=libstdc++.so
    OUTPUT_VARIABLE _gpuopt_libstdcxx
    OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT IS_ABSOLUTE "${_gpuopt_libstdcxx}")
    message(FATAL_ERROR
      "gpuopt: the C++ compiler ${CMAKE_CXX_COMPILER} has no shared libstdc++ (it answered "
      "'${_gpuopt_libstdcxx}' to -print-file-name=libstdc++.so). A module built with it crashes "
      "inside torch. Rebuild with the system compiler, e.g.\n"
      "  CXX=/usr/bin/g++ CC=/usr/bin/gcc CUDAHOSTCXX=/usr/bin/g++ pip install --no-build-isolation .")
  endif()
endif()
