// LLM decode measurement: per-token timestamps (StepClock) and a token loop that replays captured
// prefill and decode CUDA graphs from C++ (TokenLoop), so that no Python runs between two tokens.
//
// A request is begin(), then one mark() per output token. On a device, begin() and mark() record
// CUDA events on the current stream (no synchronization), so the times are the GPU's; a request is
// read back when the next one begins, or on collect(). On the host (device -1, for CPU workloads
// whose work is synchronous) they read the steady clock.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace gpuopt::torch_ext {

// The requests a StepClock has collected, in order.
struct TokenTimes {
  std::vector<double> ttft_ms;       // start -> first mark (nan for a request without marks)
  std::vector<double> e2e_ms;        // start -> last mark (nan for a request without marks)
  std::vector<std::int64_t> tokens;  // marks per request
  std::vector<double> itl_ms;        // every gap between consecutive marks, all requests pooled
};

class StepClock {
 public:
  // device >= 0: CUDA events (timing enabled) on that device, max_tokens + 1 of them, reused by
  // every request; device == -1: the host's steady clock.
  StepClock(std::int64_t device, std::int64_t max_tokens);
  ~StepClock();
  StepClock(const StepClock&) = delete;
  StepClock& operator=(const StepClock&) = delete;

  // Collects the pending request (if any), then records the start of a new one. Refuses a stream
  // that is capturing a CUDA graph: the clock times replays.
  void begin();
  // One output token is out. RuntimeError without a begun request; ValueError past max_tokens.
  void mark();
  // Reads the pending request back (waiting at most 120 s for its last event); no-op if none.
  void collect();
  // collect(), then every request collected so far.
  TokenTimes requests();
  // Forgets the collected requests (the pending one is collected and dropped too).
  void clear();
  std::int64_t n() const;
  std::int64_t device() const { return device_; }
  std::int64_t max_tokens() const { return max_tokens_; }

 private:
  struct DeviceEvents;  // the CUDA events (decode.cpp: only with CUDA compiled)
  void collect_locked();
  void stamp(std::size_t slot);  // slot 0: the start; slot i: mark i

  const std::int64_t device_;
  const std::int64_t max_tokens_;
  std::unique_ptr<DeviceEvents> events_;
  std::vector<std::chrono::steady_clock::time_point> host_times_;
  mutable std::mutex mu_;
  bool pending_ = false;
  std::int64_t marks_ = 0;
  TokenTimes collected_;
};

// One request as a token loop, on the current stream of `device`: clock.begin(), the prefill graph,
// clock.mark(), then new_tokens - 1 times the decode graph and clock.mark(). The graphs are
// torch.cuda.CUDAGraph.raw_cuda_graph_exec() handles: their owners must keep them alive, and the
// Python binding keeps the clock alive. No synchronization: the caller reads results when it needs.
class TokenLoop {
 public:
  TokenLoop(std::uintptr_t prefill_exec, std::uintptr_t decode_exec, std::int64_t device,
            std::int64_t new_tokens, StepClock* clock);
  void run();
  void run_many(std::int64_t n);
  std::int64_t device() const { return device_; }
  std::int64_t new_tokens() const { return new_tokens_; }
  bool has_clock() const { return clock_ != nullptr; }

 private:
  std::uintptr_t prefill_exec_;
  std::uintptr_t decode_exec_;
  std::int64_t device_;
  std::int64_t new_tokens_;
  StepClock* clock_;  // not owned; may be null
};

}  // namespace gpuopt::torch_ext
