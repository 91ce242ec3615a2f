// The step timeline's timestamp operator: where the executor reaches it, the wall clock.
// fleetlite/compile/step_stamps.py builds and loads it; fleetlite/compile/step_events.py puts a
// pair around each collective, the top-k exchange and the optimizer update.
//
// fleetlite_timestamp(X) -> Out (in place on X), attribute `slot`: writes the wall clock
// (CLOCK_REALTIME, nanoseconds since the epoch, the clock of Python's time.time()) into slot
// `slot` of this process's table and leaves X untouched. Being in place on the value the
// instrumented op reads (or writes), it runs right before (or after) that op, whatever order the
// executor picks. fleetlite_timestamps() copies the table out (read through ctypes after a step).
#include <atomic>
#include <chrono>
#include <cstdint>
#include <vector>

// paddle/extension.h would add PIR pass and pybind headers: 3x the compile time, none used here.
#include "paddle/common/exception.h"
#include "paddle/phi/api/all.h"

namespace {

constexpr int kSlots = 4096;
std::atomic<int64_t> stamps[kSlots];

}  // namespace

void Timestamp(paddle::Tensor& x, int slot) {
  PD_CHECK(slot >= 0 && slot < kSlots, "fleetlite_timestamp: slot ", slot, " is outside [0, ", kSlots, ")");
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  stamps[slot] = std::chrono::duration_cast<std::chrono::nanoseconds>(now).count();
}

std::vector<std::vector<int64_t>> StampShapes(const std::vector<int64_t>& x, int slot) { return {x}; }

std::vector<paddle::DataType> StampDtypes(const paddle::DataType& x) { return {x}; }

PD_BUILD_OP(fleetlite_timestamp)
    .Inputs({"X"})
    .Outputs({"Out"})
    .Attrs({"slot: int"})
    .SetInplaceMap({{"X", "Out"}})
    .SetKernelFn(PD_KERNEL(Timestamp))
    .SetInferShapeFn(PD_INFER_SHAPE(StampShapes))
    .SetInferDtypeFn(PD_INFER_DTYPE(StampDtypes));

// Copies the first `count` slots (nanoseconds; 0: never reached) into `out`.
extern "C" void fleetlite_timestamps(int64_t* out, int64_t count) {
  for (int64_t i = 0; i < count && i < kSlots; ++i) out[i] = stamps[i];
}
