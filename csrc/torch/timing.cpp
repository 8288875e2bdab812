#include "timing.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <memory>
#include <optional>
#include <vector>

#include "device.h"
#include "gpuopt/stats.h"
#include "graphs.h"

#ifdef GPUOPT_WITH_CUDA
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "gpuopt/cuda.h"
#endif

namespace gpuopt::torch_ext {
namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kHostHint = "; use mode=\"host\" on a CPU-only machine";

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

class HostSource final : public SampleSource {
 public:
  HostSource(const Callable& fn, bool sync) : fn_(fn), sync_(sync) {}
  double warmup() override { return sample().ms; }
  Sample sample() override {
    const Clock::time_point t0 = Clock::now();
    fn_(i_++);
    const Clock::time_point t1 = Clock::now();
#ifdef GPUOPT_WITH_CUDA
    if (sync_) c10::cuda::device_synchronize();
#endif
    const Clock::time_point t2 = Clock::now();
    return {ms_between(t0, t2), ms_between(t0, t1)};
  }

 private:
  const Callable& fn_;
  bool sync_;
  std::int64_t i_ = 0;
};

#ifdef GPUOPT_WITH_CUDA

// Median of the warm-up values after the first (which carries lazy initialisation), or of all.
double typical(const std::vector<double>& v) {
  if (v.empty()) return 0.0;
  if (v.size() == 1) return v.front();
  return stats::median(std::vector<double>(v.begin() + 1, v.end()));
}

// Calls per sample so that one sample lasts about target_ms.
std::int64_t calls_for(double per_call_ms, double target_ms, std::int64_t limit) {
  if (!(per_call_ms > 0.0)) return limit;
  return std::clamp<std::int64_t>(static_cast<std::int64_t>(std::ceil(target_ms / per_call_ms)), 1, limit);
}

// The L2 flush: a kernel of ours overwriting at least twice the L2, queued before a sample. It
// calls the CUDA launcher on gpuopt's own scratch buffer (no tensor crosses), not the
// gpuopt::fill_pattern_ operator, so nothing of it reaches torch's dispatcher or allocator.
class L2Flush {
 public:
  explicit L2Flush(c10::DeviceIndex device)
      : buffer_(2 * cuda::l2_cache_bytes(device) + (1 << 20)) {}
  void run(cudaStream_t stream) {
    cuda::fill_pattern(static_cast<std::uint32_t*>(buffer_.get()),
                       static_cast<std::int64_t>(buffer_.bytes() / 4), seed_++, stream);
  }
  std::int64_t bytes() const { return static_cast<std::int64_t>(buffer_.bytes()); }

 private:
  cuda::DeviceBuffer buffer_;
  std::uint32_t seed_ = 1;
};

// Spin long enough to cover the host's enqueue of one sample, so that device time excludes launch
// gaps: 1.25x the slower warm-up enqueue times plus 20 us, at most 200 ms.
std::uint64_t spin_ns_for(std::vector<double> enqueue_ms) {
  double ms = 0.0;
  if (!enqueue_ms.empty()) {
    if (enqueue_ms.size() > 1) enqueue_ms.erase(enqueue_ms.begin());
    std::sort(enqueue_ms.begin(), enqueue_ms.end());
    ms = stats::quantile_sorted(enqueue_ms, 0.9);
  }
  return static_cast<std::uint64_t>(std::min(1.25 * ms + 0.02, 200.0) * 1e6);
}

class DeviceSource : public SampleSource {
 public:
  DeviceSource(const Callable& fn, cudaStream_t stream) : fn_(fn), stream_(stream) {}

  double warmup() override {
    const cuda::NvtxRange range("gpuopt.warmup");
    start_.record(stream_);
    const Clock::time_point t0 = Clock::now();
    fn_(i_++);
    const Clock::time_point t1 = Clock::now();
    end_.record(stream_);
    end_.synchronize();
    warm_device_ms_.push_back(cuda::Event::elapsed_ms(start_, end_));
    warm_enqueue_ms_.push_back(ms_between(t0, t1));
    return warm_enqueue_ms_.back();
  }

  // Drains the stream on every way out of the sampler, unwinding included: a failure here must not
  // replace the error being reported, so it is dropped.
  void finish() noexcept override {
    try {
      cuda::synchronize_stream(stream_);
    } catch (...) {
    }
  }

  std::int64_t calls_per_sample = 1;
  std::uint64_t spin_ns = 0;
  std::int64_t spin_short = 0;

 protected:
  const Callable& fn_;
  cudaStream_t stream_;
  std::int64_t i_ = 0;
  cuda::Event start_, end_;
  std::vector<double> warm_device_ms_, warm_enqueue_ms_;
};

class LatencySource final : public DeviceSource {
 public:
  LatencySource(const Callable& fn, cudaStream_t stream, L2Flush* flush)
      : DeviceSource(fn, stream), flush_(flush) {}

  void calibrate() override { spin_ns = spin_ns_for(warm_enqueue_ms_); }

  Sample sample() override {
    const cuda::NvtxRange range("gpuopt.sample");
    if (flush_ != nullptr) flush_->run(stream_);
    cuda::delay(spin_ns, stream_);
    start_.record(stream_);
    const Clock::time_point t0 = Clock::now();
    fn_(i_++);
    const Clock::time_point t1 = Clock::now();
    end_.record(stream_);
    end_.synchronize();
    const double enqueue = ms_between(t0, t1);
    if (enqueue * 1e6 > static_cast<double>(spin_ns)) ++spin_short;
    return {cuda::Event::elapsed_ms(start_, end_), enqueue};
  }

 private:
  L2Flush* flush_;
};

class ThroughputSource final : public DeviceSource {
 public:
  ThroughputSource(const Callable& fn, cudaStream_t stream, std::int64_t calls, double target_ms)
      : DeviceSource(fn, stream), requested_calls_(calls), target_ms_(target_ms) {}

  void calibrate() override {
    calls_per_sample = requested_calls_ > 0 ? requested_calls_
                                            : calls_for(typical(warm_device_ms_), target_ms_, 100000);
  }

  // Block s spans boundary events s -> s+1; block s+1 is always queued before block s is read.
  Sample sample() override {
    const cuda::NvtxRange range("gpuopt.sample");
    if (block_ == 0) {
      boundary(0).record(stream_);
      enqueue_ms_[0] = enqueue_block();
      boundary(1).record(stream_);
    }
    enqueue_ms_[(block_ + 1) % 2] = enqueue_block();
    boundary(block_ + 2).record(stream_);
    boundary(block_ + 1).synchronize();
    const double ms = cuda::Event::elapsed_ms(boundary(block_), boundary(block_ + 1));
    const double enqueue = enqueue_ms_[block_ % 2];
    ++block_;
    const auto k = static_cast<double>(calls_per_sample);
    return {ms / k, enqueue / k};
  }

 private:
  double enqueue_block() {
    const Clock::time_point t0 = Clock::now();
    for (std::int64_t j = 0; j < calls_per_sample; ++j) fn_(i_++);
    return ms_between(t0, Clock::now());
  }
  cuda::Event& boundary(std::int64_t j) { return events_[static_cast<std::size_t>(j % 3)]; }

  std::int64_t requested_calls_;
  double target_ms_;
  std::int64_t block_ = 0;
  std::array<cuda::Event, 3> events_;
  std::array<double, 2> enqueue_ms_{};
};

class GraphSource final : public DeviceSource {
 public:
  // `stream` is a side stream; the caller made it current and ordered it after the caller's stream.
  GraphSource(const Callable& fn, cudaStream_t stream, L2Flush* flush, std::int64_t calls, double target_ms)
      : DeviceSource(fn, stream), flush_(flush), requested_calls_(calls), target_ms_(target_ms) {}

  void calibrate() override {
    calls_per_sample = requested_calls_ > 0 ? requested_calls_
                                            : calls_for(typical(warm_device_ms_), target_ms_, 1000);
    capture();
    // One untimed replay, which also tells how long the host takes to launch the graph.
    const Clock::time_point t0 = Clock::now();
    graph_.replay();
    const double launch_ms = ms_between(t0, Clock::now());
    cuda::synchronize_stream(stream_);
    spin_ns = spin_ns_for({launch_ms, launch_ms});
  }

  Sample sample() override {
    const cuda::NvtxRange range("gpuopt.sample");
    if (flush_ != nullptr) flush_->run(stream_);
    cuda::delay(spin_ns, stream_);
    start_.record(stream_);
    const Clock::time_point t0 = Clock::now();
    graph_.replay();
    const Clock::time_point t1 = Clock::now();
    end_.record(stream_);
    end_.synchronize();
    const double enqueue = ms_between(t0, t1);
    if (enqueue * 1e6 > static_cast<double>(spin_ns)) ++spin_short;
    const auto k = static_cast<double>(calls_per_sample);
    return {cuda::Event::elapsed_ms(start_, end_) / k, enqueue / k};
  }

 private:
  void capture() {
    const cuda::NvtxRange range("gpuopt.capture");
    // A pool of its own, known here: a failed capture's pool and routing are undone by name.
    const auto pool = at::cuda::graph_pool_handle();
    pool_ = {pool.first, pool.second};
    pool_uses_before_ = graph_pool_use_count(c10::cuda::current_device(), pool_);
    try {
      graph_.capture_begin(pool);
      for (std::int64_t j = 0; j < calls_per_sample; ++j) fn_(i_++);
    } catch (const std::exception& e) {
      abandon_capture();
      TORCH_CHECK_VALUE(false, "mode=\"graph\": fn could not be captured into a CUDA graph (", e.what(),
                        "). Capture needs fixed shapes and addresses, no host synchronization "
                        "(.item(), .cpu(), printing tensors) and no CPU decisions on GPU values; "
                        "time it with mode=\"latency\" or \"throughput\" instead");
    }
    try {
      graph_.capture_end();
    } catch (const std::exception& e) {
      abandon_capture();
      TORCH_CHECK_VALUE(false, "mode=\"graph\": the CUDA graph capture of fn failed (", e.what(),
                        "); time it with mode=\"latency\" or \"throughput\" instead");
    }
  }

  // Ends an open capture (if any), drops the partial graph and clears the non-sticky error.
  void abandon_capture() noexcept {
    if (cuda::stream_is_capturing(stream_)) {
      try {
        graph_.capture_end();
      } catch (...) {  // the capture was invalid; ending it is all we wanted
      }
    }
    try {
      graph_.reset();
    } catch (...) {
    }
    cuda::clear_last_error();
    release_failed_capture(c10::cuda::current_device(), pool_, pool_uses_before_);
  }

  L2Flush* flush_;
  std::int64_t requested_calls_;
  double target_ms_;
  at::cuda::CUDAGraph graph_;
  PoolId pool_{0, 0};
  int pool_uses_before_ = 0;
};

std::unique_ptr<DeviceSource> make_device_source(const Callable& fn, const MeasureOptions& o,
                                                 cudaStream_t stream, L2Flush* flush) {
  if (o.mode == "latency") return std::make_unique<LatencySource>(fn, stream, flush);
  if (o.mode == "throughput")
    return std::make_unique<ThroughputSource>(fn, stream, o.calls_per_sample, o.block_target_ms);
  return std::make_unique<GraphSource>(fn, stream, flush, o.calls_per_sample, o.block_target_ms);
}

void describe(MeasureResult& res, const DeviceSource& source) {
  res.calls_per_sample = source.calls_per_sample;
  res.delay_us = static_cast<double>(source.spin_ns) / 1e3;
  res.delay_short = source.spin_short;
}

// Sets up the device (guard, L2 flush buffer, and for graph mode a side stream ordered after the
// caller's work, made current until the end) and calls body(sources, results): one source and one
// result per callable.
template <typename Body>
void with_device_sources(const std::vector<const Callable*>& fns, const MeasureOptions& o,
                         std::vector<MeasureResult>& results, Body&& body) {
  const std::string what = "mode=\"" + o.mode + "\"";
  const c10::DeviceIndex index = checked_cuda_device(o.device, what.c_str(), kHostHint);
  const c10::cuda::CUDAGuard device_guard(index);
  std::unique_ptr<L2Flush> flush;
  if (o.flush_l2) flush = std::make_unique<L2Flush>(index);
  const c10::cuda::CUDAStream caller = c10::cuda::getCurrentCUDAStream(index);
  c10::cuda::CUDAStream stream = caller;
  std::optional<c10::cuda::CUDAStreamGuard> stream_guard;
  if (o.mode == "graph") {
    stream = c10::cuda::getStreamFromPool(false, index);
    cuda::Event ready;
    ready.record(caller.stream());
    cuda::stream_wait_event(stream.stream(), ready.get());
    stream_guard.emplace(stream);
  }
  std::vector<std::unique_ptr<DeviceSource>> sources;
  for (const Callable* fn : fns) sources.push_back(make_device_source(*fn, o, stream.stream(), flush.get()));
  results.assign(fns.size(), MeasureResult{});
  for (MeasureResult& r : results) {
    r.mode = o.mode;
    r.device = o.device;
    r.flush_bytes = flush ? flush->bytes() : 0;
  }
  body(sources);
  for (std::size_t i = 0; i < sources.size(); ++i) describe(results[i], *sources[i]);
}

#endif  // GPUOPT_WITH_CUDA

// Alternates two sources sample by sample (A B, then B A: drift that is linear over a pair cancels)
// and reports each pair's ratio A / B to the sampler, so adaptive stopping targets the speedup.
class PairSource final : public SampleSource {
 public:
  PairSource(SampleSource& a, SampleSource& b) : a_(a), b_(b) {}
  double warmup() override { return a_.warmup() + b_.warmup(); }
  void calibrate() override {
    a_.calibrate();
    b_.calibrate();
  }
  Sample sample() override {
    Sample x, y;
    if (k_++ % 2 == 0) {
      x = a_.sample();
      y = b_.sample();
    } else {
      y = b_.sample();
      x = a_.sample();
    }
    samples_a.push_back(x);
    samples_b.push_back(y);
    return {x.ms / std::max(y.ms, 1e-12), 0.0};
  }
  void finish() noexcept override {
    a_.finish();
    b_.finish();
  }

  std::vector<Sample> samples_a, samples_b;

 private:
  SampleSource& a_;
  SampleSource& b_;
  std::int64_t k_ = 0;
};

SamplerResult split(const SamplerResult& pair, const std::vector<Sample>& samples) {
  SamplerResult r = pair;
  r.ms.clear();
  r.enqueue_ms.clear();
  for (const Sample& s : samples) {
    r.ms.push_back(s.ms);
    r.enqueue_ms.push_back(s.enqueue_ms);
  }
  return r;
}

// Host-mode sources need a device guard and know whether to synchronize.
struct HostContext {
  bool sync = false;
  std::int64_t device = -1;
#ifdef GPUOPT_WITH_CUDA
  std::optional<c10::cuda::CUDAGuard> guard;
#endif
  // A negative device (Python's device="cpu") times the CPU alone, GPUs visible or not.
  explicit HostContext(const MeasureOptions& o) {
    sync = o.device >= 0 && cuda_device_count() > 0;
    if (!sync) return;
    const c10::DeviceIndex index = checked_cuda_device(o.device, "mode=\"host\"");
#ifdef GPUOPT_WITH_CUDA
    guard.emplace(index);
#else
    (void)index;
#endif
    device = o.device;
  }
};

}  // namespace

void validate(const MeasureOptions& o) {
  static const std::array<const char*, 4> kModes{"latency", "throughput", "graph", "host"};
  TORCH_CHECK_VALUE(std::find(kModes.begin(), kModes.end(), o.mode) != kModes.end(),
                    "mode must be one of \"latency\", \"throughput\", \"graph\", \"host\"; got \"",
                    o.mode, "\"");
  TORCH_CHECK_VALUE(!o.flush_l2 || o.mode == "latency" || o.mode == "graph",
                    "flush_l2=True applies to mode=\"latency\" or \"graph\" (a flush between "
                    "pipelined calls would be timed with them); got mode=\"", o.mode, "\"");
  TORCH_CHECK_VALUE(o.calls_per_sample >= 0, "calls_per_sample must be >= 1 (or None for automatic), got ",
                    o.calls_per_sample);
  TORCH_CHECK_VALUE(o.calls_per_sample <= 1 || o.mode == "throughput" || o.mode == "graph",
                    "calls_per_sample applies to mode=\"throughput\" (calls per block) or \"graph\" "
                    "(calls per graph); got mode=\"", o.mode, "\"");
  TORCH_CHECK_VALUE(std::isfinite(o.block_target_ms) && o.block_target_ms > 0,
                    "block_target_ms must be > 0, got ", o.block_target_ms);
  gpuopt::validate(o.sampler);
}

MeasureResult measure(const Callable& fn, const MeasureOptions& o) {
  validate(o);
  if (o.mode != "host") {
#ifdef GPUOPT_WITH_CUDA
    std::vector<MeasureResult> results;
    with_device_sources({&fn}, o, results, [&](auto& sources) {
      results[0].sampler = run_sampler(*sources[0], o.sampler, o.energy.get(), o.min_energy_s);
    });
    return results[0];
#else
    require_cuda((std::string("mode=\"") + o.mode + "\"").c_str(), kHostHint);
#endif
  }
  const HostContext host(o);
  HostSource source(fn, host.sync);
  MeasureResult res;
  res.mode = o.mode;
  res.device = host.device;
  res.sampler = run_sampler(source, o.sampler, o.energy.get(), o.min_energy_s);
  return res;
}

PairResult measure_pair(const Callable& a, const Callable& b, const MeasureOptions& o) {
  validate(o);
  TORCH_CHECK_VALUE(o.mode != "throughput", "interleaved comparisons support mode=\"latency\", "
                    "\"graph\" or \"host\"; got mode=\"throughput\" (pipelined blocks of two callables "
                    "would overlap)");
  PairResult out;
  auto run_pair = [&](SampleSource& sa, SampleSource& sb) {
    PairSource pair(sa, sb);
    out.ratio = run_sampler(pair, o.sampler);
    out.a.sampler = split(out.ratio, pair.samples_a);
    out.b.sampler = split(out.ratio, pair.samples_b);
  };
  if (o.mode != "host") {
#ifdef GPUOPT_WITH_CUDA
    std::vector<MeasureResult> results;
    with_device_sources({&a, &b}, o, results, [&](auto& sources) { run_pair(*sources[0], *sources[1]); });
    results[0].sampler = std::move(out.a.sampler);
    results[1].sampler = std::move(out.b.sampler);
    out.a = std::move(results[0]);
    out.b = std::move(results[1]);
    return out;
#else
    require_cuda((std::string("mode=\"") + o.mode + "\"").c_str(), kHostHint);
#endif
  }
  const HostContext host(o);
  HostSource sa(a, host.sync), sb(b, host.sync);
  run_pair(sa, sb);
  for (MeasureResult* r : {&out.a, &out.b}) {
    r->mode = o.mode;
    r->device = host.device;
  }
  return out;
}

}  // namespace gpuopt::torch_ext
