// Timing modes on top of the core sampler: what one sample is in each mode, on torch's streams.
//
//   latency     one call between CUDA events, synchronized per sample. A short spin kernel queued
//               ahead of the start event keeps the GPU busy while the host enqueues the call, so the
//               sample is device time without host launch gaps; host enqueue time is kept beside it.
//   throughput  blocks of k back-to-back calls, events at block boundaries, one block always queued
//               ahead (pipelined steady state); a sample is block time / k.
//   graph       k calls captured into one CUDA graph on a side stream; a sample is replay time / k.
//   host        steady clock around call + device synchronize (end to end; the only CPU mode).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "gpuopt/sampler.h"

namespace gpuopt::torch_ext {

// Runs the user's work once; the argument is the call index (for rotating input sets).
using Callable = std::function<void(std::int64_t call_index)>;

struct MeasureOptions {
  SamplerOptions sampler;
  std::string mode = "latency";
  bool flush_l2 = false;
  std::int64_t device = 0;
  std::int64_t calls_per_sample = 0;  // throughput block / calls per graph; 0 = sized from warm-up
  double block_target_ms = 2.0;       // auto-sizing target for one throughput block or graph replay
  // The energy of the timed region (measure() only; see run_sampler): none without a meter.
  std::shared_ptr<EnergyMeter> energy;
  double min_energy_s = 0.3;  // an adaptive run with a meter samples at least this long (a few counter steps)
};

struct MeasureResult {
  SamplerResult sampler;
  std::string mode;
  std::int64_t device = -1;  // -1: host mode without a device
  std::int64_t calls_per_sample = 1;
  double delay_us = 0;          // spin queued before each device sample (latency/graph)
  std::int64_t delay_short = 0;  // samples whose enqueue outlasted the spin: may contain host gaps
  std::int64_t flush_bytes = 0;
};

// ValueError naming the first option out of range (mode, flush_l2 and calls_per_sample for the mode,
// block_target_ms, then the sampler's options); measure() and measure_pair() call it first.
void validate(const MeasureOptions& options);

// Validates everything (ValueError naming the parameter), then measures. Exceptions thrown by the
// callable propagate unchanged, except a failed graph capture, which becomes a ValueError naming
// mode="graph" and carrying the original message. Nothing is left behind either way: the capture
// is ended, the current stream restored, events and buffers freed.
MeasureResult measure(const Callable& fn, const MeasureOptions& options);

struct PairResult {
  MeasureResult a, b;
  SamplerResult ratio;  // per-pair ratios a / b, which the stopping rule targeted
};

// Measures two callables interleaved sample by sample (A B, B A, ...) with the same options, so that
// drift of the device (clocks, power, temperature) affects both alike. Modes: latency, graph, host.
PairResult measure_pair(const Callable& a, const Callable& b, const MeasureOptions& options);

}  // namespace gpuopt::torch_ext
