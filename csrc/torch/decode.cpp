#include "decode.h"

#include <c10/util/Exception.h>

#include <cmath>
#include <limits>
#include <string>
#include <utility>

#include "device.h"

#ifdef GPUOPT_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "gpuopt/cuda.h"
#endif

namespace gpuopt::torch_ext {
namespace {

using Clock = std::chrono::steady_clock;

// The longest collect() waits for a request's last event (a hung kernel, a GPU deadlock).
constexpr double kCollectTimeoutS = 120.0;
constexpr std::int64_t kMaxTokensLimit = std::int64_t{1} << 20;

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

// RuntimeError naming `what` when this build has no CUDA (the host clock still works).
void require_cuda_compiled(const char* what, const char* hint) {
  TORCH_CHECK(cuda_compiled(), what, " needs CUDA, but gpuopt was built without CUDA (",
              no_cuda_reason(), ")", hint);
}

}  // namespace

struct StepClock::DeviceEvents {
#ifdef GPUOPT_WITH_CUDA
  std::vector<cuda::Event> events;
#endif
};

StepClock::StepClock(std::int64_t device, std::int64_t max_tokens)
    : device_(device), max_tokens_(max_tokens) {
  TORCH_CHECK_VALUE(max_tokens >= 1 && max_tokens <= kMaxTokensLimit,
                    "StepClock: max_tokens must be in [1, ", kMaxTokensLimit, "], got ",
                    max_tokens);
  TORCH_CHECK_VALUE(device >= -1,
                    "StepClock: device must be a CUDA device index, or -1 for the host clock, got ",
                    device);
  const auto slots = static_cast<std::size_t>(max_tokens) + 1;
  if (device == -1) {
    host_times_.resize(slots);
    return;
  }
  require_cuda_compiled("StepClock(device >= 0)", "; device=-1 uses the host clock");
  const c10::DeviceIndex index =
      checked_cuda_device(device, "StepClock", "; device=-1 uses the host clock");
  events_ = std::make_unique<DeviceEvents>();
#ifdef GPUOPT_WITH_CUDA
  const c10::cuda::CUDAGuard guard(index);
  events_->events.resize(slots);  // cudaEventCreate on `index`, timing enabled
#else
  (void)index;
#endif
}

StepClock::~StepClock() = default;  // an event still pending is released once it completes

void StepClock::stamp(std::size_t slot) {
  if (device_ < 0) {
    host_times_[slot] = Clock::now();
    return;
  }
#ifdef GPUOPT_WITH_CUDA
  const auto index = static_cast<c10::DeviceIndex>(device_);
  const c10::cuda::CUDAGuard guard(index);
  events_->events[slot].record(c10::cuda::getCurrentCUDAStream(index).stream());
#endif
}

void StepClock::begin() {
  const std::lock_guard<std::mutex> lock(mu_);
#ifdef GPUOPT_WITH_CUDA
  // Checked before collecting: waiting on an event would invalidate the capture.
  if (device_ >= 0) {
    const auto index = static_cast<c10::DeviceIndex>(device_);
    TORCH_CHECK(!cuda::stream_is_capturing(c10::cuda::getCurrentCUDAStream(index).stream()),
                "StepClock.begin: the current stream is capturing a CUDA graph; a StepClock times "
                "graph replays and cannot be captured");
  }
#endif
  collect_locked();
  stamp(0);
  pending_ = true;
  marks_ = 0;
}

void StepClock::mark() {
  const std::lock_guard<std::mutex> lock(mu_);
  TORCH_CHECK(pending_, "StepClock.mark: no request begun (call begin() first)");
  TORCH_CHECK_VALUE(marks_ < max_tokens_, "StepClock.mark: more than max_tokens=", max_tokens_,
                    " marks in one request");
  stamp(static_cast<std::size_t>(marks_) + 1);
  ++marks_;
}

void StepClock::collect() {
  const std::lock_guard<std::mutex> lock(mu_);
  collect_locked();
}

TokenTimes StepClock::requests() {
  const std::lock_guard<std::mutex> lock(mu_);
  collect_locked();
  return collected_;
}

void StepClock::clear() {
  const std::lock_guard<std::mutex> lock(mu_);
  try {
    collect_locked();
  } catch (...) {
    collected_ = TokenTimes{};
    throw;
  }
  collected_ = TokenTimes{};
}

std::int64_t StepClock::n() const {
  const std::lock_guard<std::mutex> lock(mu_);
  return static_cast<std::int64_t>(collected_.tokens.size());
}

void StepClock::collect_locked() {
  if (!pending_) return;
  // The request leaves the pending state whatever happens below: a failed read drops it.
  pending_ = false;
  const std::int64_t marks = std::exchange(marks_, 0);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  if (marks == 0) {
    collected_.ttft_ms.push_back(nan);
    collected_.e2e_ms.push_back(nan);
    collected_.tokens.push_back(0);
    return;
  }
  // gap_ms[i]: slot i - 1 to slot i (slot 0 is the start, so gap_ms[1] is the TTFT); all read
  // before anything is appended, so that a failure leaves the collected requests as they were.
  std::vector<double> gap_ms(static_cast<std::size_t>(marks) + 1, 0.0);
  double ttft = nan, e2e = nan;
  if (device_ < 0) {
    for (std::int64_t i = 1; i <= marks; ++i) {
      gap_ms[i] = ms_between(host_times_[i - 1], host_times_[i]);
    }
    ttft = gap_ms[1];
    e2e = ms_between(host_times_[0], host_times_[marks]);
  } else {
#ifdef GPUOPT_WITH_CUDA
    const std::vector<cuda::Event>& ev = events_->events;
    TORCH_CHECK(cuda::wait_event(ev[marks].get(), kCollectTimeoutS), "StepClock: waited ",
                kCollectTimeoutS,
                " s for the last token's event of the pending request on cuda:", device_,
                " and it has not completed (a hung kernel?); the request is dropped");
    for (std::int64_t i = 1; i <= marks; ++i) {
      gap_ms[i] = static_cast<double>(cuda::Event::elapsed_ms(ev[i - 1], ev[i]));
    }
    ttft = gap_ms[1];
    e2e = static_cast<double>(cuda::Event::elapsed_ms(ev[0], ev[marks]));
#endif
  }
  collected_.ttft_ms.push_back(ttft);
  collected_.e2e_ms.push_back(e2e);
  collected_.tokens.push_back(marks);
  collected_.itl_ms.insert(collected_.itl_ms.end(), gap_ms.begin() + 2, gap_ms.end());
}

TokenLoop::TokenLoop(std::uintptr_t prefill_exec, std::uintptr_t decode_exec, std::int64_t device,
                     std::int64_t new_tokens, StepClock* clock)
    : prefill_exec_(prefill_exec),
      decode_exec_(decode_exec),
      device_(device),
      new_tokens_(new_tokens),
      clock_(clock) {
  TORCH_CHECK_VALUE(new_tokens >= 1, "TokenLoop: new_tokens must be >= 1, got ", new_tokens);
  const char* handle =
      " must be an instantiated CUDA graph (torch.cuda.CUDAGraph.raw_cuda_graph_exec(), a nonzero "
      "int), got 0";
  TORCH_CHECK_VALUE(prefill_exec != 0, "TokenLoop: prefill_exec", handle);
  TORCH_CHECK_VALUE(decode_exec != 0, "TokenLoop: decode_exec", handle);
  require_cuda_compiled("TokenLoop", "; it replays CUDA graphs");
  (void)checked_cuda_device(device, "TokenLoop");
  if (clock != nullptr) {
    TORCH_CHECK_VALUE(clock->device() == device, "TokenLoop: clock must time the loop's device ",
                      device, " (StepClock(device=", device, ", ...)), got a clock on device ",
                      clock->device());
    TORCH_CHECK_VALUE(new_tokens <= clock->max_tokens(), "TokenLoop: new_tokens (", new_tokens,
                      ") must be <= the clock's max_tokens (", clock->max_tokens(), ")");
  }
}

void TokenLoop::run() {
#ifdef GPUOPT_WITH_CUDA
  const auto index = static_cast<c10::DeviceIndex>(device_);
  const c10::cuda::CUDAGuard guard(index);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(index).stream();
  const auto prefill = reinterpret_cast<cudaGraphExec_t>(prefill_exec_);
  const auto decode = reinterpret_cast<cudaGraphExec_t>(decode_exec_);
  if (clock_ != nullptr) clock_->begin();
  cuda::graph_launch(prefill, stream);
  if (clock_ != nullptr) clock_->mark();
  for (std::int64_t t = 1; t < new_tokens_; ++t) {
    cuda::graph_launch(decode, stream);
    if (clock_ != nullptr) clock_->mark();
  }
#else
  require_cuda_compiled("TokenLoop.run", "");  // the constructor refused already
#endif
}

void TokenLoop::run_many(std::int64_t n) {
  TORCH_CHECK_VALUE(n >= 1, "TokenLoop.run_many: n must be >= 1, got ", n);
  for (std::int64_t i = 0; i < n; ++i) run();
}

}  // namespace gpuopt::torch_ext
