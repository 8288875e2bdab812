// Device ceilings measured with kernels of ours: HBM and L2 bandwidth, FP32 FMA rate, launch and
// graph-node overhead. Rates are medians over timed launches after one warm-up.
#include <algorithm>
#include <chrono>
#include <functional>
#include <vector>

#include "ceilings_kernels.cuh"
#include "gpuopt/cuda.h"

namespace gpuopt::cuda {
namespace {

constexpr int kThreads = 256;

// Enough resident blocks to fill every SM: its resident threads (2048 on the A100 and Hopper, 1536 on
// sm_86/sm_89 such as the L4) in blocks of kThreads, so the grid is one full wave.
unsigned full_grid() {
  int device = 0;
  GPUOPT_CHECK_CUDA(cudaGetDevice(&device));
  const int sms = device_attribute(cudaDevAttrMultiProcessorCount, device);
  const int threads = device_attribute(cudaDevAttrMaxThreadsPerMultiProcessor, device);
  return static_cast<unsigned>(sms * std::max(1, threads / kThreads));
}

// Times `launch` once per rep between events; returns (median, best) of amount / time.
Rate rate(const std::function<void()>& launch, double amount, int reps, cudaStream_t stream, bool per_ms_is_rate) {
  GPUOPT_CHECK_VALUE(reps > 0, "reps must be > 0, got ", reps);
  launch();  // warm-up
  GPUOPT_CHECK_LAUNCH();
  Event start, end;
  std::vector<double> ms(static_cast<std::size_t>(reps));
  for (double& m : ms) {
    start.record(stream);
    launch();
    end.record(stream);
    end.synchronize();
    GPUOPT_CHECK_LAUNCH();
    m = Event::elapsed_ms(start, end);
  }
  std::sort(ms.begin(), ms.end());
  const double median_ms = ms[ms.size() / 2];
  Rate r;
  if (per_ms_is_rate) {  // amount per second
    r.median = amount / (median_ms * 1e-3);
    r.best = amount / (ms.front() * 1e-3);
  } else {  // time per amount, in us
    r.median = median_ms * 1e3 / amount;
    r.best = ms.front() * 1e3 / amount;
  }
  return r;
}

std::int64_t vectors(std::size_t bytes) {
  GPUOPT_CHECK_VALUE(bytes >= 16 && bytes % 16 == 0, "bytes must be a positive multiple of 16, got ", bytes);
  return static_cast<std::int64_t>(bytes / 16);
}

}  // namespace

Rate hbm_read_gbps(const void* buffer, std::size_t bytes, int reps, cudaStream_t stream) {
  const std::int64_t n = vectors(bytes);
  DeviceBuffer sink(sizeof(std::uint32_t));
  const unsigned grid = full_grid();
  return rate([&] { kernels::hbm_read<<<grid, kThreads, 0, stream>>>(static_cast<const uint4*>(buffer), n,
                                                                      static_cast<std::uint32_t*>(sink.get())); },
              static_cast<double>(bytes) / 1e9, reps, stream, true);
}

Rate hbm_write_gbps(void* buffer, std::size_t bytes, int reps, cudaStream_t stream) {
  const std::int64_t n = vectors(bytes);
  const unsigned grid = full_grid();
  return rate([&] { kernels::hbm_write<<<grid, kThreads, 0, stream>>>(static_cast<uint4*>(buffer), n); },
              static_cast<double>(bytes) / 1e9, reps, stream, true);
}

Rate hbm_copy_gbps(void* dst, const void* src, std::size_t bytes, int reps, cudaStream_t stream) {
  const std::int64_t n = vectors(bytes);
  const unsigned grid = full_grid();
  return rate([&] {
    kernels::hbm_copy<<<grid, kThreads, 0, stream>>>(static_cast<uint4*>(dst), static_cast<const uint4*>(src), n);
  }, 2.0 * static_cast<double>(bytes) / 1e9, reps, stream, true);
}

Rate l2_read_gbps(const void* buffer, std::size_t bytes, int passes, int reps, cudaStream_t stream) {
  const std::int64_t n = vectors(bytes);
  GPUOPT_CHECK_VALUE(passes > 0, "passes must be > 0, got ", passes);
  DeviceBuffer sink(sizeof(std::uint32_t));
  const unsigned grid = full_grid();
  return rate([&] {
    kernels::l2_read<<<grid, kThreads, 0, stream>>>(static_cast<const uint4*>(buffer), n, passes,
                                                    static_cast<std::uint32_t*>(sink.get()));
  }, static_cast<double>(bytes) * passes / 1e9, reps, stream, true);
}

Rate fp32_fma_tflops(float* sink, int reps, cudaStream_t stream) {
  const unsigned grid = full_grid();
  constexpr int iters = 16384;
  const double flops = 2.0 * kernels::kFmaChains * iters * static_cast<double>(grid) * kThreads;
  return rate([&] { kernels::fp32_fma<<<grid, kThreads, 0, stream>>>(sink, iters); }, flops / 1e12, reps, stream,
              true);
}

LaunchCost launch_overhead(int launches, cudaStream_t stream) {
  GPUOPT_CHECK_VALUE(launches > 0, "launches must be > 0, got ", launches);
  kernels::empty<<<1, 1, 0, stream>>>();
  GPUOPT_CHECK_CUDA(cudaStreamSynchronize(stream));
  Event start, end;
  start.record(stream);
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < launches; ++i) kernels::empty<<<1, 1, 0, stream>>>();
  const auto t1 = std::chrono::steady_clock::now();
  end.record(stream);
  end.synchronize();
  GPUOPT_CHECK_LAUNCH();
  LaunchCost c;
  c.host_us_per_launch = std::chrono::duration<double, std::micro>(t1 - t0).count() / launches;
  c.device_us_per_kernel = static_cast<double>(Event::elapsed_ms(start, end)) * 1e3 / launches;
  return c;
}

Rate graph_node_us(int nodes, int reps, cudaStream_t stream) {
  GPUOPT_CHECK_VALUE(nodes > 0, "nodes must be > 0, got ", nodes);
  cudaStream_t capture = nullptr;
  GPUOPT_CHECK_CUDA(cudaStreamCreateWithFlags(&capture, cudaStreamNonBlocking));
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  auto cleanup = [&] {
    if (exec != nullptr) cudaGraphExecDestroy(exec);
    if (graph != nullptr) cudaGraphDestroy(graph);
    cudaStreamDestroy(capture);
  };
  try {
    GPUOPT_CHECK_CUDA(cudaStreamBeginCapture(capture, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < nodes; ++i) kernels::empty<<<1, 1, 0, capture>>>();
    GPUOPT_CHECK_CUDA(cudaStreamEndCapture(capture, &graph));
    GPUOPT_CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    const Rate r = rate([&] { GPUOPT_CHECK_CUDA(cudaGraphLaunch(exec, stream)); }, nodes, reps, stream, false);
    cleanup();
    return r;
  } catch (...) {
    cleanup();
    throw;
  }
}

}  // namespace gpuopt::cuda
