// CUDA graph captures that fail without leaving state behind in torch's caching allocator.
//
// at::cuda::CUDAGraph::capture_begin() routes the capture stream's allocations to a private memory
// pool and holds a reference to that pool. When the capture fails (the captured code synchronized,
// called .item(), or raised), older torch releases (2.11 among them) leave both behind:
// capture_end() throws at cudaStreamEndCapture before it ends the routing, and reset() releases the
// pool only after a successful capture. The allocator then believes a capture is still under way for
// the rest of the process, and while it does, empty_cache() and the retry after a failed cudaMalloc
// return no cached memory at all: one failed capture, then one large out-of-memory cell, and every
// later cell of the process runs out of memory with the GPU "reserved but unallocated". Newer torch
// cleans up in reset() itself; what it already undid is not undone twice here.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <utility>

namespace gpuopt::torch_ext {

using PoolId = std::pair<std::uint64_t, std::uint64_t>;  // torch's MempoolId_t

// How many graphs (and captures under way) hold private pool `pool` of `device`: 0 when the pool
// does not exist (never created, or already freed), -1 when this torch cannot tell.
int graph_pool_use_count(std::int64_t device, PoolId pool);

// After a failed capture into `pool` on `device`, once the CUDAGraph ended what capture it could and
// was reset: ends the allocators' routing to the pool if torch left it on, and drops the reference the
// capture took if torch did not (`use_count_before`: graph_pool_use_count before capture_begin).
// Returns what it had to undo (0 when torch had cleaned up itself). Never throws.
int release_failed_capture(std::int64_t device, PoolId pool, int use_count_before) noexcept;

}  // namespace gpuopt::torch_ext
