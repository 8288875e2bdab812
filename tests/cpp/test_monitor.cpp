#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "gpuopt/errors.h"
#include "gpuopt/monitor.h"
#include "gpuopt/nvml.h"

namespace {

using gpuopt::DeviceReading;
using gpuopt::Monitor;
using gpuopt::TimedReading;
using Clock = std::chrono::steady_clock;

// Polls `cond` every millisecond for at most `limit`; returns its last value.
template <typename Cond>
bool wait_for(Cond cond, std::chrono::milliseconds limit = std::chrono::milliseconds(5000)) {
  const Clock::time_point end = Clock::now() + limit;
  while (!cond()) {
    if (Clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// ------------------------------------------------------------------------------------- the monitor

// Returns an increasing SM clock (1000 + call number); can throw at a given call or block on a gate.
class FakeProbe : public gpuopt::Probe {
 public:
  DeviceReading read() override {
    const int k = ++calls;
    if (k == throw_at) throw std::runtime_error("driver went away at call " + std::to_string(k));
    if (k == block_at) {
      std::unique_lock<std::mutex> lock(mutex_);
      blocked = true;
      gate_.wait(lock, [this] { return open_; });
    }
    DeviceReading r;
    r.sm_mhz = 1000 + k;
    r.compute_processes = 1;
    return r;
  }
  void open_gate() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      open_ = true;
    }
    gate_.notify_all();
  }

  std::atomic<int> calls{0};
  std::atomic<bool> blocked{false};
  int throw_at = 0;
  int block_at = 0;

 private:
  std::mutex mutex_;
  std::condition_variable gate_;
  bool open_ = false;
};

TEST(Monitor, ReadsAtTheIntervalUntilStopped) {
  auto probe = std::make_shared<FakeProbe>();
  Monitor m(probe, /*interval_ms=*/10.0);
  m.start();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_TRUE(m.stop());
  const std::vector<TimedReading> r = m.readings();
  // 200 ms at one reading per 10 ms: 21 at most (one at start), far fewer only if the thread starved.
  EXPECT_GE(r.size(), 5u);
  EXPECT_LE(r.size(), 22u);
  EXPECT_EQ(static_cast<int>(r.size()), probe->calls.load());
  for (std::size_t i = 0; i < r.size(); ++i) {
    // On a fixed schedule (a late reading does not shift the later ones), never ahead of it.
    EXPECT_GE(r[i].t_s, 0.010 * static_cast<double>(i) - 1e-6) << "reading " << i;
    EXPECT_EQ(*r[i].reading.sm_mhz, 1000u + i + 1);
  }
  EXPECT_LT(r.front().t_s, 0.05);  // the first reading comes at once
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  EXPECT_EQ(m.readings().size(), r.size());  // stopped means stopped
  EXPECT_EQ(m.error(), "");
}

TEST(Monitor, StopWakesTheThreadInsteadOfWaitingOutTheInterval) {
  auto probe = std::make_shared<FakeProbe>();
  Monitor m(probe, /*interval_ms=*/60000.0);
  m.start();
  ASSERT_TRUE(wait_for([&] { return probe->calls.load() == 1; }));
  const Clock::time_point t0 = Clock::now();
  EXPECT_TRUE(m.stop());
  EXPECT_LT(ms_since(t0), 1000.0);
  EXPECT_EQ(m.readings().size(), 1u);
  EXPECT_TRUE(m.stop());  // idempotent
}

TEST(Monitor, TheDestructorStopsARunningMonitor) {
  auto probe = std::make_shared<FakeProbe>();
  std::weak_ptr<FakeProbe> alive = probe;
  {
    Monitor m(probe, 1.0);
    const FakeProbe* raw = probe.get();  // kept alive by the monitor
    probe.reset();
    m.start();
    ASSERT_TRUE(wait_for([&] { return raw->calls.load() >= 3; }));
  }
  EXPECT_TRUE(alive.expired());  // the thread was joined and let go of the probe
}

TEST(Monitor, AProbeThatThrowsEndsTheReadingsAndIsReported) {
  auto probe = std::make_shared<FakeProbe>();
  probe->throw_at = 4;
  Monitor m(probe, 1.0);
  m.start();
  ASSERT_TRUE(wait_for([&] { return !m.error().empty(); }));
  EXPECT_EQ(m.error(), "driver went away at call 4");
  EXPECT_TRUE(m.stop());
  EXPECT_EQ(m.readings().size(), 3u);
  const auto s = m.summary(0.0);
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->samples, 3u);
  EXPECT_EQ(*s->sm_mhz_median, 1002u);
}

TEST(Monitor, StopIsBoundedWhenTheProbeHangs) {
  auto probe = std::make_shared<FakeProbe>();
  probe->block_at = 2;
  std::weak_ptr<FakeProbe> alive = probe;
  auto m = std::make_unique<Monitor>(probe, 1.0, /*stop_timeout_ms=*/50.0);
  m->start();
  ASSERT_TRUE(wait_for([&] { return probe->blocked.load(); }));
  const Clock::time_point t0 = Clock::now();
  EXPECT_FALSE(m->stop());  // gave up waiting
  const double waited_ms = ms_since(t0);
  EXPECT_GE(waited_ms, 45.0);
  EXPECT_LT(waited_ms, 1000.0);
  EXPECT_EQ(m->readings().size(), 1u);
  m.reset();  // the detached thread keeps what it needs
  probe->open_gate();
  probe.reset();
  ASSERT_TRUE(wait_for([&] { return alive.expired(); }));  // it finished and let go
}

TEST(Monitor, StartsOnceAndValidatesItsOptions) {
  auto probe = std::make_shared<FakeProbe>();
  Monitor m(probe, 5.0);
  m.start();
  try {
    m.start();
    ADD_FAILURE() << "a second start() did not throw";
  } catch (const gpuopt::Error& e) {
    EXPECT_EQ(e.kind(), gpuopt::ErrorKind::kRuntime);
    EXPECT_STREQ(e.what(), "a monitor can be started once only");
  }
  EXPECT_TRUE(m.stop());
  auto message = [&](double interval_ms, double timeout_ms) -> std::string {
    try {
      Monitor bad(probe, interval_ms, timeout_ms);
    } catch (const gpuopt::Error& e) {
      EXPECT_EQ(e.kind(), gpuopt::ErrorKind::kValue);
      return e.what();
    }
    return "";
  };
  EXPECT_EQ(message(0.0, 10.0), "interval_ms must be a finite number of milliseconds > 0, got 0");
  EXPECT_EQ(message(NAN, 10.0).rfind("interval_ms must be", 0), 0u);
  EXPECT_EQ(message(1.0, -1.0), "stop_timeout_ms must be a finite number of milliseconds > 0, got -1");
  EXPECT_THROW(Monitor(nullptr), gpuopt::Error);
}

// ------------------------------------------------------------------------------------- summaries

TimedReading at(double t_s, std::uint32_t mhz, std::uint64_t reasons = 0, std::uint32_t procs = 0) {
  TimedReading r;
  r.t_s = t_s;
  r.reading.sm_mhz = mhz;
  r.reading.max_sm_mhz = 1980;
  r.reading.clock_event_reasons = reasons;
  r.reading.compute_processes = procs;
  return r;
}

TEST(MonitorSummary, SkipsTheWarmUpAndNamesTheReasons) {
  // Warm-up at a low clock with a thermal reason and 3 processes; none of it may show.
  const std::vector<TimedReading> r{at(0.00, 800, 0x40, 3), at(0.05, 900, 0x40, 3), at(0.10, 1980, 0x1, 1),
                                    at(0.20, 1700, 0x4, 2), at(0.30, 1900, 0x0, 1), at(0.40, 1755, 0x1, 1)};
  const auto s = gpuopt::summarize_readings(r, 0.1);
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->samples, 4u);
  EXPECT_EQ(*s->sm_mhz_median, 1900u);  // upper middle of 1700 1755 1900 1980: a clock it ran at
  EXPECT_EQ(*s->sm_mhz_min, 1700u);
  EXPECT_EQ(*s->max_sm_mhz, 1980u);
  EXPECT_EQ(s->clock_event_reasons, 0x5u);  // 0x1 (idle) is kept in the mask but not named
  EXPECT_EQ(s->throttle_reasons, std::vector<std::string>{"sw_power_cap"});
  EXPECT_EQ(s->compute_processes, 2u);
}

TEST(MonitorSummary, FallsBackToTheLastReadingAndHandlesMissingFields) {
  EXPECT_FALSE(gpuopt::summarize_readings({}, 0.0).has_value());
  const auto last = gpuopt::summarize_readings({at(0.0, 1000), at(0.1, 1500, 0x88)}, 5.0);
  ASSERT_TRUE(last.has_value());
  EXPECT_EQ(last->samples, 1u);
  EXPECT_EQ(*last->sm_mhz_median, 1500u);
  EXPECT_EQ(last->throttle_reasons, (std::vector<std::string>{"hw_slowdown", "hw_power_brake"}));
  TimedReading bare;  // every query failed
  bare.t_s = 1.0;
  const auto s = gpuopt::summarize_readings({bare, bare}, 0.0);
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->samples, 2u);
  EXPECT_FALSE(s->sm_mhz_median.has_value());
  EXPECT_FALSE(s->max_sm_mhz.has_value());
  EXPECT_EQ(s->compute_processes, 0u);
  EXPECT_TRUE(s->throttle_reasons.empty());
}

TEST(MonitorSummary, AgreesWithADirectComputationOnRandomReadings) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  std::uniform_int_distribution<std::uint32_t> mhz(600, 2000), procs(0, 5), bit(0, 8);
  const int n = 1 + static_cast<int>(rng() % 200);
  const double skip_s = 0.01 * static_cast<double>(rng() % 100);
  std::vector<TimedReading> r;
  std::vector<std::uint32_t> kept;
  std::uint64_t mask = 0;
  std::uint32_t most = 0;
  for (int i = 0; i < n; ++i) {
    r.push_back(at(0.01 * i, mhz(rng), std::uint64_t{1} << bit(rng), procs(rng)));
    if (r.back().t_s >= skip_s) {
      kept.push_back(*r.back().reading.sm_mhz);
      mask |= *r.back().reading.clock_event_reasons;
      most = std::max(most, *r.back().reading.compute_processes);
    }
  }
  if (kept.empty()) {
    kept.push_back(*r.back().reading.sm_mhz);
    mask = *r.back().reading.clock_event_reasons;
    most = *r.back().reading.compute_processes;
  }
  const auto s = gpuopt::summarize_readings(r, skip_s);
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->samples, kept.size());
  EXPECT_EQ(*s->sm_mhz_min, *std::min_element(kept.begin(), kept.end()));
  // The upper middle: as many readings above it as below it, or one more below.
  const std::uint32_t med = *s->sm_mhz_median;
  const auto below = std::count_if(kept.begin(), kept.end(), [&](std::uint32_t x) { return x < med; });
  const auto above = std::count_if(kept.begin(), kept.end(), [&](std::uint32_t x) { return x > med; });
  const auto half = static_cast<std::ptrdiff_t>(kept.size() / 2);
  EXPECT_LE(below, half);
  EXPECT_LE(above, static_cast<std::ptrdiff_t>(kept.size()) - half - 1);
  EXPECT_NE(std::find(kept.begin(), kept.end(), med), kept.end());
  EXPECT_EQ(s->clock_event_reasons, mask);
  EXPECT_EQ(s->compute_processes, most);
  std::vector<std::string> names;
  for (const auto& [b, name] : std::map<std::uint64_t, const char*>{
           {0x4, "sw_power_cap"}, {0x8, "hw_slowdown"}, {0x20, "sw_thermal"}, {0x40, "hw_thermal"},
           {0x80, "hw_power_brake"}}) {
    if (mask & b) names.emplace_back(name);
  }
  EXPECT_EQ(s->throttle_reasons, names);
}

// ------------------------------------------------------------------------------------- NVML

namespace nv = gpuopt::nvml;

// A fake NVML: one device, UUID "GPU-fake-0", index 0; values set by the test.
struct FakeNvml {
  nv::Return init_status = nv::kSuccess;
  unsigned sm_mhz = 0, max_sm_mhz = 0;
  unsigned long long event_reasons = 0, throttle_reasons = 0;
  unsigned processes = 0;
  std::atomic<int> max_clock_calls{0};
  std::atomic<int> bad_process_queries{0};  // called with a count or an array: layout dependence
  int device_tag = 0;                       // its address is the handle
};
FakeNvml* fake = nullptr;

nv::Return fake_init() { return fake->init_status; }
const char* fake_error_string(nv::Return status) { return status == 999 ? "Unknown Error" : "fake error"; }
nv::Return fake_by_uuid(const char* uuid, nv::Handle* h) {
  if (std::strcmp(uuid, "GPU-fake-0") != 0) return 13;  // NVML_ERROR_NOT_FOUND
  *h = &fake->device_tag;
  return nv::kSuccess;
}
nv::Return fake_by_index(unsigned index, nv::Handle* h) {
  if (index != 0) return 2;  // NVML_ERROR_INVALID_ARGUMENT
  *h = &fake->device_tag;
  return nv::kSuccess;
}
nv::Return fake_clock(nv::Handle h, int type, unsigned* mhz) {
  if (h != &fake->device_tag || type != nv::kClockSm) return 2;
  *mhz = fake->sm_mhz;
  return nv::kSuccess;
}
nv::Return fake_max_clock(nv::Handle h, int type, unsigned* mhz) {
  ++fake->max_clock_calls;
  if (h != &fake->device_tag || type != nv::kClockSm) return 2;
  *mhz = fake->max_sm_mhz;
  return nv::kSuccess;
}
nv::Return fake_event_reasons(nv::Handle, unsigned long long* mask) {
  *mask = fake->event_reasons;
  return nv::kSuccess;
}
nv::Return fake_throttle_reasons(nv::Handle, unsigned long long* mask) {
  *mask = fake->throttle_reasons;
  return nv::kSuccess;
}
nv::Return fake_processes(nv::Handle, unsigned* count, void* infos) {
  if (*count != 0 || infos != nullptr) {
    ++fake->bad_process_queries;
    return 2;
  }
  *count = fake->processes;
  return fake->processes == 0 ? nv::kSuccess : nv::kErrorInsufficientSize;
}

template <typename Fn>
void* sym(Fn* fn) {
  return reinterpret_cast<void*>(fn);
}

std::map<std::string, void*> full_driver() {
  return {{"nvmlInit_v2", sym(fake_init)},
          {"nvmlErrorString", sym(fake_error_string)},
          {"nvmlDeviceGetHandleByUUID", sym(fake_by_uuid)},
          {"nvmlDeviceGetHandleByIndex_v2", sym(fake_by_index)},
          {"nvmlDeviceGetClockInfo", sym(fake_clock)},
          {"nvmlDeviceGetMaxClockInfo", sym(fake_max_clock)},
          {"nvmlDeviceGetCurrentClocksEventReasons", sym(fake_event_reasons)},
          {"nvmlDeviceGetCurrentClocksThrottleReasons", sym(fake_throttle_reasons)},
          {"nvmlDeviceGetComputeRunningProcesses_v3", sym(fake_processes)}};
}

std::shared_ptr<const nv::Library> fake_library(std::map<std::string, void*> symbols) {
  return std::make_shared<const nv::Library>(
      [symbols](const char* name) -> void* {
        const auto it = symbols.find(name);
        return it == symbols.end() ? nullptr : it->second;
      },
      "fake-nvml");
}

class Nvml : public ::testing::Test {
 protected:
  void SetUp() override {
    const unsigned seed = std::random_device{}();
    rng_.seed(seed);
    trace_ = std::make_unique<::testing::ScopedTrace>(__FILE__, __LINE__, "seed " + std::to_string(seed));
    state_ = std::make_unique<FakeNvml>();
    fake = state_.get();
    fake->sm_mhz = 600 + rng_() % 1400;
    fake->max_sm_mhz = 2000 + rng_() % 100;
    fake->event_reasons = 0x4 | (std::uint64_t{1} << (rng_() % 9));
    fake->throttle_reasons = 0x80;
    fake->processes = 1 + rng_() % 7;
  }
  void TearDown() override { fake = nullptr; }

  std::mt19937 rng_;
  std::unique_ptr<FakeNvml> state_;
  std::unique_ptr<::testing::ScopedTrace> trace_;
};

TEST_F(Nvml, ReadsEveryQuantityOfADeviceFoundByUuid) {
  const auto lib = fake_library(full_driver());
  ASSERT_TRUE(lib->active()) << lib->reason();
  const nv::Device d = nv::Device::open(lib, "GPU-fake-0", -1);
  ASSERT_TRUE(d.active()) << d.reason();
  EXPECT_EQ(d.reason(), "");
  EXPECT_EQ(d.sm_clock_mhz(), fake->sm_mhz);
  EXPECT_EQ(d.max_sm_clock_mhz(), fake->max_sm_mhz);
  EXPECT_EQ(d.clock_event_reasons(), fake->event_reasons);  // the newer entry point wins
  EXPECT_EQ(d.compute_processes(), fake->processes);
  fake->processes = 0;
  EXPECT_EQ(d.compute_processes(), 0u);  // NVML_SUCCESS: none
  EXPECT_EQ(fake->bad_process_queries.load(), 0);
}

TEST_F(Nvml, FallsBackToTheIndexAndToOlderEntryPoints) {
  auto symbols = full_driver();
  symbols.erase("nvmlDeviceGetCurrentClocksEventReasons");  // a driver before 535
  symbols.erase("nvmlDeviceGetComputeRunningProcesses_v3");
  symbols["nvmlDeviceGetComputeRunningProcesses"] = sym(fake_processes);
  const auto lib = fake_library(symbols);
  const nv::Device d = nv::Device::open(lib, "GPU-not-this-one", 0);
  ASSERT_TRUE(d.active()) << d.reason();
  EXPECT_EQ(d.clock_event_reasons(), 0x80u);
  EXPECT_EQ(d.compute_processes(), fake->processes);
}

TEST_F(Nvml, OptionalEntryPointsMissingGiveNoValueNotAFailure) {
  auto symbols = full_driver();
  for (const char* name : {"nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons",
                           "nvmlDeviceGetComputeRunningProcesses_v3", "nvmlErrorString"}) {
    symbols.erase(name);
  }
  const nv::Device d = nv::Device::open(fake_library(symbols), "", 0);
  ASSERT_TRUE(d.active()) << d.reason();
  EXPECT_EQ(d.sm_clock_mhz(), fake->sm_mhz);
  EXPECT_FALSE(d.clock_event_reasons().has_value());
  EXPECT_FALSE(d.compute_processes().has_value());
}

TEST_F(Nvml, ANotFoundDeviceIsInactiveWithBothReasons) {
  const nv::Device d = nv::Device::open(fake_library(full_driver()), "GPU-elsewhere", 3);
  EXPECT_FALSE(d.active());
  EXPECT_EQ(d.reason(),
            "no device with UUID GPU-elsewhere (fake error (13)); no device with index 3 (fake error (2))");
  EXPECT_FALSE(d.sm_clock_mhz().has_value());
  EXPECT_FALSE(d.compute_processes().has_value());
  EXPECT_EQ(nv::Device::open(fake_library(full_driver()), "", -1).reason(),
            "neither a UUID nor an index was given");
}

TEST_F(Nvml, AFailedInitOrAMissingEntryPointMakesTheLibraryInactive) {
  fake->init_status = 999;
  const auto failed = fake_library(full_driver());
  EXPECT_FALSE(failed->active());
  EXPECT_EQ(failed->reason(), "nvmlInit_v2 failed in fake-nvml: Unknown Error (999)");
  const nv::Device d = nv::Device::open(failed, "GPU-fake-0", 0);
  EXPECT_FALSE(d.active());
  EXPECT_EQ(d.reason(), failed->reason());
  auto symbols = full_driver();
  symbols.erase("nvmlDeviceGetClockInfo");
  EXPECT_EQ(fake_library(symbols)->reason(),
            "fake-nvml has no nvmlDeviceGetClockInfo (not NVML, or a driver too old)");
}

TEST_F(Nvml, TheProbeReadsTheDeviceAndAsksForTheMaxClockOnce) {
  gpuopt::NvmlProbe probe(nv::Device::open(fake_library(full_driver()), "GPU-fake-0", -1));
  for (int i = 0; i < 3; ++i) {
    const DeviceReading r = probe.read();
    EXPECT_EQ(r.sm_mhz, fake->sm_mhz);
    EXPECT_EQ(r.max_sm_mhz, fake->max_sm_mhz);
    EXPECT_EQ(r.clock_event_reasons, fake->event_reasons);
    EXPECT_EQ(r.compute_processes, fake->processes);
  }
  EXPECT_EQ(fake->max_clock_calls.load(), 1);
}

TEST_F(Nvml, AMonitorOfAFakeDeviceSummarisesItsReadings) {
  Monitor m(std::make_shared<gpuopt::NvmlProbe>(nv::Device::open(fake_library(full_driver()), "GPU-fake-0", 0)),
            2.0);
  m.start();
  ASSERT_TRUE(wait_for([&] { return m.readings().size() >= 3; }));
  ASSERT_TRUE(m.stop());
  const auto s = m.summary(0.0);
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(*s->sm_mhz_median, fake->sm_mhz);
  EXPECT_EQ(*s->max_sm_mhz, fake->max_sm_mhz);
  EXPECT_EQ(s->clock_event_reasons, fake->event_reasons);
  EXPECT_EQ(s->throttle_reasons, nv::clock_event_reason_names(fake->event_reasons));
  EXPECT_NE(std::find(s->throttle_reasons.begin(), s->throttle_reasons.end(), "sw_power_cap"),
            s->throttle_reasons.end());
  EXPECT_EQ(s->compute_processes, fake->processes);
}

TEST(NvmlLibrary, AMissingLibraryIsInactiveWithAReason) {
  const auto lib = nv::Library::open("libgpuopt-no-such-nvml.so.1");
  EXPECT_FALSE(lib->active());
  EXPECT_EQ(lib->reason().rfind("cannot load libgpuopt-no-such-nvml.so.1: ", 0), 0u) << lib->reason();
  const nv::Device d = nv::Device::open(lib, "GPU-0", 0);
  EXPECT_FALSE(d.active());
  EXPECT_EQ(d.reason(), lib->reason());
  EXPECT_FALSE(d.sm_clock_mhz().has_value());
}

TEST(NvmlLibrary, ALibraryThatIsNotNvmlIsInactiveWithAReason) {
  const auto lib = nv::Library::open("libm.so.6");
  EXPECT_FALSE(lib->active());
  EXPECT_EQ(lib->reason(), "libm.so.6 has no nvmlInit_v2 (not NVML, or a driver too old)");
}

TEST(NvmlLibrary, TheSystemLibraryLoadsOnceAndNeverThrows) {
  const auto lib = nv::Library::system();
  ASSERT_NE(lib, nullptr);
  EXPECT_EQ(lib, nv::Library::system());
  EXPECT_NE(lib->active(), !lib->reason().empty());
  const nv::Device d = nv::Device::open(lib, "GPU-00000000-0000-0000-0000-000000000000", -1);
  EXPECT_FALSE(d.active());  // no GPU has the nil UUID
  EXPECT_FALSE(d.reason().empty());
}

}  // namespace
