// MSTopK's selection as one CPU operator (fleetlite_mstopk): fleetlite/compression/topk_select.py's algorithm in
// one sample pass and one full pass, without the fresh allocation and full pass that each op of
// the Paddle-op composition costs. fleetlite/compression/mstopk_kernel.py builds and loads it.
//
// Inputs: X (float32 or float64, flattened), attributes k, stride, target, iterations (the
// sampling rule of fleetlite.compression.topk_select.sample_stride / sample_target, computed in Python).
// Outputs: Values (X's dtype) and Indices (int64), k of each, in descending |x| order, equal
// magnitudes by ascending index.
//
// NaN counts as a magnitude above every number (like inf), so whenever X holds a non-finite
// element, Values holds one too: the caller's finiteness check of the k values covers all of X.
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <vector>

// paddle/extension.h would add PIR pass and pybind headers: 3x the compile time, none used here.
#include "paddle/common/exception.h"
#include "paddle/phi/api/all.h"

namespace {

template <typename T>
inline T Magnitude(T v) {
  return std::isnan(v) ? std::numeric_limits<T>::infinity() : std::abs(v);
}

// Where fleetlite.compression.topk_select.sampled_threshold's bisection ends, from the target-th largest magnitude
// of the strided sample (its docstring derives the closed form).
template <typename T>
T SampledThreshold(const T* x, int64_t n, int64_t stride, int64_t target, int64_t iterations) {
  std::vector<T> sample;
  sample.reserve((n + stride - 1) / stride);
  double sum = 0;
  T high = 0;
  for (int64_t i = 0; i < n; i += stride) {
    const T a = Magnitude(x[i]);
    sample.push_back(a);
    sum += a;
    high = std::max(high, a);
  }
  auto nth = sample.begin() + (target - 1);
  std::nth_element(sample.begin(), nth, sample.end(), std::greater<T>());
  const double kth = *nth, mean = sum / static_cast<double>(sample.size());
  const double base = kth >= mean ? mean : 0.0;
  const double span = high - base;
  const double steps = std::ldexp(1.0, static_cast<int>(iterations));
  const double grid = base + std::floor((kth - base) / span * steps) * (span / steps);
  return static_cast<T>(span > 0 && std::isfinite(grid) ? std::min(grid, kth) : kth);
}

template <typename T>
struct Candidate {
  T magnitude;
  int64_t index;
  // Larger magnitude first, equal magnitudes by ascending index: a total order, so the result
  // does not depend on the order survivors were found in.
  bool operator<(const Candidate& other) const {
    return magnitude > other.magnitude || (magnitude == other.magnitude && index < other.index);
  }
};

// Every element with |x| >= threshold, every NaN included: !(|x| < t) is true for NaN. Blocks
// of kBlock elements are first counted with a branch-free (vectorized) loop and scanned only when
// one of them passes, which few do. The magnitudes travel with the indices, so the trim reads no
// more of x (random reads of a large x cost a cache miss each).
template <typename T>
std::vector<Candidate<T>> AtLeast(const T* x, int64_t n, T threshold, int64_t expected) {
  constexpr int64_t kBlock = 32;
  std::vector<Candidate<T>> found;
  found.reserve(expected);
  auto scan = [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      if (!(std::abs(x[i]) < threshold)) found.push_back({Magnitude(x[i]), i});
    }
  };
  int64_t start = 0;
  for (; start + kBlock <= n; start += kBlock) {
    int below = 0;
    for (int64_t i = start; i < start + kBlock; ++i) below += std::abs(x[i]) < threshold;
    if (below != kBlock) scan(start, start + kBlock);
  }
  scan(start, n);
  return found;
}

template <typename T>
void Select(const T* x, int64_t n, int64_t k, int64_t stride, int64_t target, int64_t iterations,
            T* values, int64_t* indices) {
  auto survivors = AtLeast(x, n, SampledThreshold(x, n, stride, target, iterations), 2 * k);
  if (static_cast<int64_t>(survivors.size()) < k) {
    // An unlucky sample: the exact k-th largest magnitude as the threshold lets k or more through.
    std::vector<T> magnitudes(n);
    std::transform(x, x + n, magnitudes.begin(), Magnitude<T>);
    std::nth_element(magnitudes.begin(), magnitudes.begin() + (k - 1), magnitudes.end(), std::greater<T>());
    const T kth = magnitudes[k - 1];
    std::vector<T>().swap(magnitudes);
    survivors = AtLeast(x, n, kth, k);
  }
  std::nth_element(survivors.begin(), survivors.begin() + (k - 1), survivors.end());
  std::sort(survivors.begin(), survivors.begin() + k);
  for (int64_t j = 0; j < k; ++j) {
    indices[j] = survivors[j].index;
    values[j] = x[survivors[j].index];
  }
}

}  // namespace

std::vector<paddle::Tensor> MstopkForward(const paddle::Tensor& x, int64_t k, int64_t stride, int64_t target,
                                          int64_t iterations) {
  const int64_t n = x.numel();
  PD_CHECK(x.is_cpu(), "fleetlite_mstopk runs on CPU tensors only");
  PD_CHECK(k >= 1 && k <= n, "fleetlite_mstopk: k must be in [1, numel], got k=", k, " numel=", n);
  PD_CHECK(stride >= 1 && target >= 1 && target <= (n + stride - 1) / stride,
           "fleetlite_mstopk: target must be in [1, sample size], got stride=", stride, " target=", target);
  auto values = paddle::empty({k}, x.dtype(), paddle::CPUPlace());
  auto indices = paddle::empty({k}, paddle::DataType::INT64, paddle::CPUPlace());
  PD_DISPATCH_FLOATING_TYPES(x.dtype(), "fleetlite_mstopk", ([&] {
    Select<data_t>(x.data<data_t>(), n, k, stride, target, iterations, values.data<data_t>(),
                   indices.data<int64_t>());
  }));
  return {values, indices};
}

std::vector<std::vector<int64_t>> MstopkShapes(const std::vector<int64_t>& x_shape, int64_t k, int64_t stride,
                                               int64_t target, int64_t iterations) {
  return {{k}, {k}};
}

std::vector<paddle::DataType> MstopkDtypes(const paddle::DataType& x_dtype) {
  return {x_dtype, paddle::DataType::INT64};
}

PD_BUILD_OP(fleetlite_mstopk)
    .Inputs({"X"})
    .Outputs({"Values", "Indices"})
    .Attrs({"k: int64_t", "stride: int64_t", "target: int64_t", "iterations: int64_t"})
    .SetKernelFn(PD_KERNEL(MstopkForward))
    .SetInferShapeFn(PD_INFER_SHAPE(MstopkShapes))
    .SetInferDtypeFn(PD_INFER_DTYPE(MstopkDtypes));
