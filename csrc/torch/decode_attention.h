// The process-wide setting of gpuopt::decode_attention (decode_attention.cpp), for tests and benchmarks.
#pragma once

namespace gpuopt::torch_ext {

// Whether the CUDA kernel may split a short cache over a thread block cluster (Hopper; see
// cuda::DecodeAttentionParams::cluster). Read at each call: a captured graph keeps what it captured.
// set_ returns the previous value.
bool decode_attention_cluster();
bool set_decode_attention_cluster(bool enabled);

}  // namespace gpuopt::torch_ext
