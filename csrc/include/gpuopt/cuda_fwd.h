// Typed CUDA handles for headers that must compile without the CUDA toolkit (the LibTorch adapter's
// headers are also built when CUDA is not compiled). cudaStream_t and cudaEvent_t are exactly these
// pointer types, so values pass between the two spellings without casts.
#pragma once

struct CUstream_st;
struct CUevent_st;

namespace gpuopt::cuda {

using StreamHandle = CUstream_st*;  // == cudaStream_t
using EventHandle = CUevent_st*;    // == cudaEvent_t

}  // namespace gpuopt::cuda
