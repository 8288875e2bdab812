// LLM decode measurement: the per-token clock, the C++ token loop over captured prefill/decode
// graphs, and the timing engine driving that loop without the GIL.
#include <pybind11/stl.h>

#include <cstdint>
#include <optional>
#include <string>

#include "../torch/decode.h"
#include "../torch/decode_linear.h"
#include "../torch/decode_stream.h"
#include "../torch/int8_linear.h"
#include "../torch/timing.h"
#include "bindings.h"
#include "measure_options.h"

namespace gpuopt::python {

using torch_ext::StepClock;
using torch_ext::TokenLoop;
using torch_ext::TokenTimes;

void bind_llm(py::module_& m) {
  py::class_<StepClock>(m, "StepClock")
      .def(py::init<std::int64_t, std::int64_t>(), py::arg("device"), py::arg("max_tokens"))
      .def("begin", &StepClock::begin, py::call_guard<py::gil_scoped_release>())
      .def("mark", &StepClock::mark, py::call_guard<py::gil_scoped_release>())
      .def("collect", &StepClock::collect, py::call_guard<py::gil_scoped_release>())
      .def(
          "requests",
          [](StepClock& clock) {
            TokenTimes t;
            {
              py::gil_scoped_release nogil;
              t = clock.requests();
            }
            py::dict d;
            d["ttft_ms"] = t.ttft_ms;
            d["e2e_ms"] = t.e2e_ms;
            d["tokens"] = t.tokens;
            d["itl_ms"] = t.itl_ms;
            return d;
          },
          "Collects the pending request, then {ttft_ms, e2e_ms, tokens: one per request; itl_ms: "
          "every gap between consecutive marks, all requests pooled, in order}.")
      .def("clear", &StepClock::clear, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("n", &StepClock::n)
      .def_property_readonly("device", &StepClock::device)
      .def_property_readonly("max_tokens", &StepClock::max_tokens);

  py::class_<TokenLoop>(m, "TokenLoop")
      .def(py::init([](std::uintptr_t prefill_exec, std::uintptr_t decode_exec, std::int64_t device,
                       std::int64_t new_tokens, StepClock* clock, const py::object& /*owner*/) {
             return std::make_unique<TokenLoop>(prefill_exec, decode_exec, device, new_tokens, clock);
           }),
           py::arg("prefill_exec"), py::arg("decode_exec"), py::arg("device"), py::arg("new_tokens"),
           py::arg("clock") = py::none(), py::arg("owner") = py::none(),
           // The loop keeps its clock alive, and `owner`: what the executables replay into (the
           // CUDAGraph objects and the tensors they read and write), so a loop kept past its decoder
           // never replays freed executables or memory.
           py::keep_alive<1, 6>(), py::keep_alive<1, 7>())
      .def("run", &TokenLoop::run, py::call_guard<py::gil_scoped_release>())
      .def("run_many", &TokenLoop::run_many, py::arg("n"), py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("device", &TokenLoop::device)
      .def_property_readonly("new_tokens", &TokenLoop::new_tokens);

  m.def(
      "measure_token_loop",
      [](TokenLoop& loop, const PyOptions& options) {
        const torch_ext::MeasureOptions o = to_options(options);
        TORCH_CHECK_VALUE(o.device == loop.device(), "measure_token_loop: options.device (",
                          o.device, ") must be the loop's device (", loop.device(), ")");
        TORCH_CHECK_VALUE(!(loop.has_clock() && o.mode == "graph"),
                          "measure_token_loop: mode=\"graph\" would capture the loop's StepClock; "
                          "give a TokenLoop without a clock, or another mode");
        const torch_ext::Callable call = [&loop](std::int64_t) { loop.run(); };
        // No Python runs in the loop, so other Python threads may.
        torch_ext::MeasureResult result;
        {
          py::gil_scoped_release nogil;
          result = torch_ext::measure(call, o);
        }
        return to_dict(result);
      },
      py::arg("loop"), py::arg("options"),
      "Times loop.run() (one request) entirely in C++, without the GIL; measure_callable's dict.");

  m.def(
      "int8_linear_kernel",
      [](const std::optional<std::string>& kernel) {
        return kernel.has_value() ? torch_ext::set_int8_linear_kernel(*kernel) : torch_ext::int8_linear_kernel();
      },
      py::arg("kernel") = py::none(),
      "The CUDA kernel torch.ops.gpuopt.int8_weight_only_linear runs for 1 to 16 rows: 'auto' (tensor cores "
      "where they apply -- float16/bfloat16 x, K % 64 == 0, compute capability 8.0+ -- from two rows on (four "
      "for N > 16384), for K >= 4096 or N <= 2048; else 'simt', faster for one row of a wide, short matrix), "
      "'simt' or 'tensor-core'. With a name, sets it process-wide and returns the previous one; without, "
      "returns it. For tests and benchmarks.");

  m.def(
      "decode_linear_kernel",
      [](const std::optional<std::string>& kernel) {
        return kernel.has_value() ? torch_ext::set_decode_linear_kernel(*kernel) : torch_ext::decode_linear_kernel();
      },
      py::arg("kernel") = py::none(),
      "What torch.ops.gpuopt.decode_linear runs on CUDA: 'auto' (gpuopt's tensor-core kernel for 1 to 8 rows of "
      "float16/bfloat16, K a multiple of 32, compute capability 8.0+; cuBLAS otherwise) or 'cublas' (always "
      "ATen's linear). With a name, sets it process-wide and returns the previous one; without, returns it. "
      "A captured graph keeps what it captured. For tests and benchmarks.");

  m.def(
      "programmatic_launch",
      [](std::optional<bool> enabled) {
        return enabled.has_value() ? torch_ext::set_programmatic_launch(*enabled) : torch_ext::programmatic_launch();
      },
      py::arg("enabled") = py::none(),
      "Whether gpuopt's decode kernels (decode_linear, int8_weight_only_linear, decode_attention) launch with "
      "programmatic dependent launch on compute capability 9.0+ with code built for it (default True): each may "
      "start while the kernel before it finishes, and waits for it before any load. With a "
      "value, sets it process-wide and returns the previous one; without, returns it. A captured graph keeps "
      "what it captured. For benchmarks that compare the two.");

  m.def("programmatic_launch_runs", &torch_ext::programmatic_launch_runs, py::arg("device"),
        "Whether gpuopt's decode kernels launch programmatically on CUDA device `device` now: programmatic_launch() "
        "is on, the device has compute capability 9.0+ and this build's code for it is built for 9.0+. False in a "
        "build without CUDA; ValueError where no CUDA device is visible, IndexError for an index out of range.");

  py::class_<torch_ext::DecodeProgram>(m, "DecodeProgram",
                                       "A decode step as one persistent kernel (batch 1, float16/bfloat16, compute "
                                       "capability 9.0+): operations added in the order they run, each returning "
                                       "its output's activation id; finish() uploads the program, run(ids, "
                                       "position) launches it on the current stream (capturable). One block an SM "
                                       "streams its weight tiles through shared memory ahead of need; operations "
                                       "wait on their inputs' words, not on a grid barrier.")
      .def(py::init<std::int64_t, c10::ScalarType>(), py::arg("device"), py::arg("dtype"))
      .def("embed", &torch_ext::DecodeProgram::embed, py::arg("table"), py::arg("positions") = py::none(),
           py::arg("position_offset") = 0,
           "out = table[id] + positions[position + position_offset]; returns its activation id")
      .def("linear", &torch_ext::DecodeProgram::linear, py::arg("input"), py::arg("weights"), py::arg("biases"),
           py::arg("norm_weight") = py::none(), py::arg("norm_bias") = py::none(), py::arg("eps") = 1e-5,
           py::arg("residual") = py::none(), py::arg("relu") = false, py::arg("output") = true,
           py::arg("plain") = py::none(), py::arg("scales") = py::none(),
           "out = relu?(layer_norm?(input) @ cat(weights).T + cat(biases)) + residual?, rounded to the program's "
           "dtype after the product, the ReLU and the residual as the model's modules round; the norm is folded "
           "into the product: norm_weight * input is rounded where the model rounds the normed values, and the "
           "biases and the weights' products with the norm's weight and bias are taken now, in float32 (a later "
           "change to them needs a new program); weights: 1 to 3 row blocks [N_p, K], of the program's dtype or "
           "int8 with scales (one tensor of per-row scales per weight, taken now in float32; a program's weights are "
           "all int8 or none is); plain: a tensor receiving the output too; output=False: no activation (returns -1)")
      .def("attention", &torch_ext::DecodeProgram::attention, py::arg("input"), py::arg("k_cache"),
           py::arg("v_cache"), py::arg("scale"),
           "one token's attention over caches [1, H, L, D] at the step's position (written there first); input: "
           "a fused q/k/v activation (queries, keys, values); returns its activation id")
      .def("finish", &torch_ext::DecodeProgram::finish)
      .def("run", &torch_ext::DecodeProgram::run, py::arg("ids"), py::arg("position"), py::arg("trace") = py::none(),
           py::arg("tokens") = py::none(), py::arg("column") = py::none(),
           "the step for the token `ids` (one int64) at `position` (one int64: the cache's fill level), on the "
           "current stream; trace: None or an int64 tensor [blocks, n_ops, 2] receiving each block's nanosecond "
           "timestamps per operation (its input in, the operation done; a linear's input time is the latest of "
           "its warps', kept by an atomic maximum, so the tensor must hold values below the timer's, such as "
           "zeros or -1); tokens ([T] or [1, T]) and column (one value), int64, together: greedy decoding in the "
           "step -- the argmax of the last operation's plain output (the logits) written into ids and "
           "tokens[clamp(column, 0, T - 1)], position and column advanced by one")
      .def_property("blocks", &torch_ext::DecodeProgram::blocks, &torch_ext::DecodeProgram::set_blocks,
                    "the step's grid: the SM count by default; set before finish() to 1 .. the SMs, or 0 for one "
                    "block an SM (a RuntimeError after finish()); fewer blocks take more tiles and heads each")
      .def_property("stages", &torch_ext::DecodeProgram::stages, &torch_ext::DecodeProgram::set_stages,
                    "the ring's stages each block streams its weights through: 0 before finish(), which sets the "
                    "default (5, or fewer where fewer fit); settable after it to 2 .. the most a block's shared "
                    "memory holds, or 0 for the default")
      .def_property_readonly("max_stages", &torch_ext::DecodeProgram::max_stages,
                             "the most stages a block's shared memory holds (0 before finish())")
      .def_property_readonly("device", &torch_ext::DecodeProgram::device)
      .def_property_readonly("n_ops", &torch_ext::DecodeProgram::n_ops)
      .def_property_readonly("finished", &torch_ext::DecodeProgram::finished)
      .def_property_readonly("words", &torch_ext::DecodeProgram::words)
      .def_property_readonly("max_position", &torch_ext::DecodeProgram::max_position)
      .def_property_readonly("vocab", &torch_ext::DecodeProgram::vocab)
      .def_property_readonly("weight_bytes", &torch_ext::DecodeProgram::weight_bytes)
      .def_property_readonly("int8_weights", &torch_ext::DecodeProgram::int8_weights,
                             "whether the linear operations' weights are int8 (with per-row scales)");

  m.def(
      "decode_linear_layout",
      [](const std::optional<int>& warps, const std::optional<int>& vector) {
        if (!warps.has_value() && !vector.has_value()) return torch_ext::decode_linear_layout();
        const auto now = torch_ext::decode_linear_layout();
        return torch_ext::set_decode_linear_layout(warps.value_or(now.first), vector.value_or(now.second));
      },
      py::arg("warps") = py::none(), py::arg("vector") = py::none(),
      "The layout of torch.ops.gpuopt.decode_linear's kernel, (warps, vector): warps per block splitting K (0: "
      "chosen from K; 4, 8, 16, 32) and 16-byte loads per weight row, lane and chunk (0: chosen; 1, 2, 4). With "
      "a value, sets it process-wide and returns the previous pair; without, returns it. For tests and "
      "benchmarks.");

  m.def(
      "int8_linear_vector",
      [](const std::optional<int>& vector) {
        return vector.has_value() ? torch_ext::set_int8_linear_vector(*vector) : torch_ext::int8_linear_vector();
      },
      py::arg("vector") = py::none(),
      "16-byte loads per weight row, lane and chunk of int8_weight_only_linear's tensor-core kernel: 0 (the "
      "default: 2 where K % 128 == 0, a row's chunk then a whole 128-byte line), 1 or 2. With a value, sets it "
      "process-wide and returns the previous one; without, returns it. For tests and benchmarks.");

  m.def(
      "int8_linear_warps",
      [](const std::optional<int>& warps) {
        return warps.has_value() ? torch_ext::set_int8_linear_warps(*warps) : torch_ext::int8_linear_warps();
      },
      py::arg("warps") = py::none(),
      "Warps per block of int8_weight_only_linear's tensor-core kernel (they split K): 0 (the default: "
      "chosen from N and K), 4, 8, 16 or 32. With a value, sets it process-wide and returns the previous one; "
      "without, returns it. For tests and benchmarks.");
}

}  // namespace gpuopt::python
