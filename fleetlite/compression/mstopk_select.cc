// MSTopK's selection as compiled CPU operators: fleetlite/compression/topk_select.py's algorithm in
// one sample pass and one full pass, without the fresh allocation and full pass that each op of
// the Paddle-op composition costs. fleetlite/compression/mstopk_kernel.py builds and loads them.
//
// fleetlite_mstopk: one tensor. Input X (float32 or float64, flattened), attributes k, stride,
// target, iterations (the sampling rule of fleetlite.compression.topk_select.sample_stride /
// sample_target, computed in Python). Outputs: Values (X's dtype) and Indices (int64), k of each,
// in descending |x| order, equal magnitudes by ascending index.
//
// The bucket ops (strategies/topk_exchange.py's exchange of a bucket of gradients):
// - fleetlite_topk_bucket_select(_accumulated): the top-k of each gradient of a bucket in one
//   call. Per gradient j, ks[j] elements (all of them, in index order, when ks[j] is its size)
//   chosen as fleetlite_mstopk chooses them; Values holds them back to back in gradient order,
//   Indices (int32) their offsets in the bucket (the gradients laid end to end). The
//   _accumulated form takes each gradient's residual and, in place, adds the gradient to it,
//   selects from the sum and leaves the unsent part there (error feedback): zero at a sent
//   element, or what float16 rounding lost when `wire_float16` (the values travel as float16).
// - fleetlite_topk_bucket_scatter: in place, each gradient of the bucket becomes the sum, in the
//   order given, of the (value, bucket offset) pairs that land in it (the all-gathered pairs of
//   every rank, in rank order), times `scale`; every other element zero.
//
// NaN counts as a magnitude above every number (like inf), so whenever X holds a non-finite
// element, Values holds one too: the caller's finiteness check of the k values covers all of X
// (the bucket select checks its values itself and names the gradient).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

// paddle/extension.h would add PIR pass and pybind headers: 3x the compile time, none used here.
#include "paddle/common/exception.h"
#include "paddle/phi/api/all.h"
#include "paddle/phi/common/float16.h"
#include "paddle/phi/core/dense_tensor.h"

namespace {

template <typename T>
inline T Magnitude(T v) {
  return std::isnan(v) ? std::numeric_limits<T>::infinity() : std::abs(v);
}

// Error feedback's accumulation rides on the selection's passes: where `add` is given, the
// selection is of x + add, the sample reads x[i] + add[i], and the full pass writes x[i] += add[i]
// just before testing it (one pass over the gradient and the residual instead of two).
template <typename T>
inline T Summed(const T* x, const T* add, int64_t i) {
  return add == nullptr ? x[i] : x[i] + add[i];
}

// Where fleetlite.compression.topk_select.sampled_threshold's bisection ends, from the target-th largest magnitude
// of the strided sample (its docstring derives the closed form).
template <typename T>
T SampledThreshold(const T* x, const T* add, int64_t n, int64_t stride, int64_t target, int64_t iterations) {
  std::vector<T> sample;
  sample.reserve((n + stride - 1) / stride);
  double sum = 0;
  T high = 0;
  for (int64_t i = 0; i < n; i += stride) {
    const T a = Magnitude(Summed(x, add, i));
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
// more of x (random reads of a large x cost a cache miss each). With `add`, x += add first, block
// by block (x is then the caller's own buffer: a residual).
template <typename T>
std::vector<Candidate<T>> AtLeast(T* x, const T* add, int64_t n, T threshold, int64_t expected) {
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
    if (add != nullptr) {
      for (int64_t i = start; i < start + kBlock; ++i) x[i] += add[i];
    }
    int below = 0;
    for (int64_t i = start; i < start + kBlock; ++i) below += std::abs(x[i]) < threshold;
    if (below != kBlock) scan(start, start + kBlock);
  }
  if (add != nullptr) {
    for (int64_t i = start; i < n; ++i) x[i] += add[i];
  }
  scan(start, n);
  return found;
}

// The k elements of largest |x| (with `add`: of x += add, see Summed), in descending |x| order
// (equal magnitudes by ascending index). x is written only with `add`.
template <typename T>
std::vector<Candidate<T>> TopK(T* x, const T* add, int64_t n, int64_t k, int64_t stride, int64_t target,
                               int64_t iterations) {
  auto survivors = AtLeast(x, add, n, SampledThreshold(x, add, n, stride, target, iterations), 2 * k);
  if (static_cast<int64_t>(survivors.size()) < k) {
    // An unlucky sample: the exact k-th largest magnitude as the threshold lets k or more through.
    std::vector<T> magnitudes(n);
    std::transform(x, x + n, magnitudes.begin(), Magnitude<T>);
    std::nth_element(magnitudes.begin(), magnitudes.begin() + (k - 1), magnitudes.end(), std::greater<T>());
    const T kth = magnitudes[k - 1];
    std::vector<T>().swap(magnitudes);
    survivors = AtLeast<T>(x, nullptr, n, kth, k);    // x holds the sum by now
  }
  std::nth_element(survivors.begin(), survivors.begin() + (k - 1), survivors.end());
  survivors.resize(k);
  std::sort(survivors.begin(), survivors.end());
  return survivors;
}

template <typename T>
void Select(const T* x, int64_t n, int64_t k, int64_t stride, int64_t target, int64_t iterations,
            T* values, int64_t* indices) {
  const auto chosen = TopK<T>(const_cast<T*>(x), nullptr, n, k, stride, target, iterations);
  for (int64_t j = 0; j < k; ++j) {
    indices[j] = chosen[j].index;
    values[j] = x[chosen[j].index];
  }
}

std::shared_ptr<phi::DenseTensor> Dense(const paddle::Tensor& t) {
  auto dense = std::dynamic_pointer_cast<phi::DenseTensor>(t.impl());
  PD_CHECK(dense != nullptr && t.is_cpu(), "fleetlite top-k bucket ops take dense CPU tensors only");
  return dense;
}

struct BucketPlan {
  const std::vector<int>& ks;
  const std::vector<int>& strides;
  const std::vector<int>& targets;
  int64_t iterations;
  const std::vector<std::string>& names;
};

// Selects gradient j's top-k from `from[j]` (the gradient, or its residual once the gradient was
// added to it) into values/indices at `*written`; with `residuals`, leaves the unsent part there.
template <typename T>
void SelectBucket(const std::vector<paddle::Tensor>& grads, std::vector<paddle::Tensor>* residuals,
                  const BucketPlan& plan, bool wire_float16, T* values, int32_t* indices) {
  int64_t offset = 0, written = 0;
  for (size_t j = 0; j < grads.size(); ++j) {
    auto grad = Dense(grads[j]);
    const int64_t n = grad->numel(), k = plan.ks[j];
    PD_CHECK(k >= 1 && k <= n, "fleetlite top-k bucket select: k must be in [1, numel] for ", plan.names[j]);
    T* x = grad->data<T>();
    const T* add = nullptr;
    if (residuals != nullptr) {
      auto residual = Dense((*residuals)[j]);
      PD_CHECK(residual->numel() == n, "fleetlite top-k bucket select: the residual of ", plan.names[j],
               " has ", residual->numel(), " elements, its gradient ", n);
      add = x;
      x = residual->data<T>();
    }
    auto place = [&](int64_t i) {
      values[written] = x[i];
      indices[written++] = static_cast<int32_t>(offset + i);
      if (residuals != nullptr) {
        const T sent = wire_float16 ? static_cast<T>(static_cast<float>(phi::dtype::float16(x[i]))) : x[i];
        x[i] -= sent;
      }
    };
    const int64_t first = written;
    if (k == n) {
      for (int64_t i = 0; i < n; ++i) {
        if (add != nullptr) x[i] += add[i];
        place(i);
      }
    } else {
      for (const auto& chosen : TopK<T>(x, add, n, k, plan.strides[j], plan.targets[j], plan.iterations)) {
        place(chosen.index);
      }
    }
    for (int64_t i = first; i < written; ++i) {
      PD_CHECK(std::isfinite(values[i]), "top-k selection of the gradient of ", plan.names[j],
               ": it holds inf or NaN; gradients must be finite");
    }
    offset += n;
  }
}

template <typename T>
void ScatterBucket(std::vector<paddle::Tensor>& grads, const T* values, const int32_t* indices, int64_t pairs,
                   float scale) {
  std::vector<T*> slots;
  std::vector<int64_t> ends;
  int64_t end = 0;
  for (auto& grad : grads) {
    auto dense = Dense(grad);
    std::memset(dense->data<T>(), 0, dense->numel() * sizeof(T));
    slots.push_back(dense->data<T>());
    end += dense->numel();
    ends.push_back(end);
  }
  auto element = [&](int32_t i) -> T& {
    PD_CHECK(i >= 0 && i < end, "fleetlite_topk_bucket_scatter: offset ", i, " outside the bucket of ", end);
    const auto j = std::upper_bound(ends.begin(), ends.end(), static_cast<int64_t>(i)) - ends.begin();
    return slots[j][i - (ends[j] - grads[j].numel())];
  };
  for (int64_t p = 0; p < pairs; ++p) element(indices[p]) += values[p];
  if (scale == 1.0f) return;
  std::vector<int32_t> touched(indices, indices + pairs);
  std::sort(touched.begin(), touched.end());
  touched.erase(std::unique(touched.begin(), touched.end()), touched.end());
  for (int32_t i : touched) element(i) *= static_cast<T>(scale);
}

std::vector<paddle::Tensor> BucketSelect(const std::vector<paddle::Tensor>& grads,
                                         std::vector<paddle::Tensor>* residuals, const BucketPlan& plan,
                                         bool wire_float16) {
  PD_CHECK(!grads.empty() && plan.ks.size() == grads.size() && plan.strides.size() == grads.size() &&
               plan.targets.size() == grads.size() && plan.names.size() == grads.size(),
           "fleetlite top-k bucket select: one k, stride, target and name per gradient");
  int64_t total = 0, numel = 0;
  for (size_t j = 0; j < grads.size(); ++j) {
    total += plan.ks[j];
    numel += grads[j].numel();
  }
  PD_CHECK(numel <= std::numeric_limits<int32_t>::max(), "fleetlite top-k bucket select: a bucket of ", numel,
           " elements does not fit int32 offsets");
  auto values = paddle::empty({total}, grads[0].dtype(), paddle::CPUPlace());
  auto indices = paddle::empty({total}, paddle::DataType::INT32, paddle::CPUPlace());
  PD_DISPATCH_FLOATING_TYPES(grads[0].dtype(), "fleetlite_topk_bucket_select", ([&] {
    SelectBucket<data_t>(grads, residuals, plan, wire_float16, values.data<data_t>(), indices.data<int32_t>());
  }));
  return {values, indices};
}

}  // namespace

std::vector<paddle::Tensor> TopkBucketSelect(const std::vector<paddle::Tensor>& grads,
                                             const std::vector<int>& ks, const std::vector<int>& strides,
                                             const std::vector<int>& targets, int64_t iterations,
                                             const std::vector<std::string>& names) {
  return BucketSelect(grads, nullptr, {ks, strides, targets, iterations, names}, false);
}

std::vector<paddle::Tensor> TopkBucketSelectAccumulated(
    const std::vector<paddle::Tensor>& grads, std::vector<paddle::Tensor>& residuals, const std::vector<int>& ks,
    const std::vector<int>& strides, const std::vector<int>& targets, int64_t iterations,
    const std::vector<std::string>& names, bool wire_float16) {
  return BucketSelect(grads, &residuals, {ks, strides, targets, iterations, names}, wire_float16);
}

void TopkBucketScatter(std::vector<paddle::Tensor>& grads, const paddle::Tensor& values,
                       const paddle::Tensor& indices, float scale) {
  PD_CHECK(values.numel() == indices.numel() && values.dtype() == grads[0].dtype(),
           "fleetlite_topk_bucket_scatter: as many values (of the gradients' dtype) as indices");
  PD_DISPATCH_FLOATING_TYPES(values.dtype(), "fleetlite_topk_bucket_scatter", ([&] {
    ScatterBucket<data_t>(grads, values.data<data_t>(), indices.data<int32_t>(), values.numel(), scale);
  }));
}

std::vector<std::vector<int64_t>> SelectShapes(const std::vector<std::vector<int64_t>>& grads,
                                               const std::vector<int>& ks, const std::vector<int>& strides,
                                               const std::vector<int>& targets, int64_t iterations,
                                               const std::vector<std::string>& names) {
  int64_t total = 0;
  for (int k : ks) total += k;
  return {{total}, {total}};
}

std::vector<std::vector<int64_t>> SelectAccumulatedShapes(const std::vector<std::vector<int64_t>>& grads,
                                                          const std::vector<std::vector<int64_t>>& residuals,
                                                          const std::vector<int>& ks,
                                                          const std::vector<int>& strides,
                                                          const std::vector<int>& targets, int64_t iterations,
                                                          const std::vector<std::string>& names, bool wire_float16) {
  return SelectShapes(grads, ks, strides, targets, iterations, names);
}

std::vector<paddle::DataType> SelectDtypes(const std::vector<paddle::DataType>& grads) {
  return {grads[0], paddle::DataType::INT32};
}

std::vector<paddle::DataType> SelectAccumulatedDtypes(const std::vector<paddle::DataType>& grads,
                                                      const std::vector<paddle::DataType>& residuals) {
  return SelectDtypes(grads);
}

std::vector<std::vector<int64_t>> ScatterShapes(const std::vector<std::vector<int64_t>>& grads,
                                                const std::vector<int64_t>& values,
                                                const std::vector<int64_t>& indices, float scale) {
  return grads;
}

std::vector<paddle::DataType> ScatterDtypes(const std::vector<paddle::DataType>& grads,
                                            const paddle::DataType& values, const paddle::DataType& indices) {
  return grads;
}

PD_BUILD_OP(fleetlite_topk_bucket_select)
    .Inputs({paddle::Vec("X")})
    .Outputs({"Values", "Indices"})
    .Attrs({"ks: std::vector<int>", "strides: std::vector<int>", "targets: std::vector<int>",
            "iterations: int64_t", "names: std::vector<std::string>"})
    .SetKernelFn(PD_KERNEL(TopkBucketSelect))
    .SetInferShapeFn(PD_INFER_SHAPE(SelectShapes))
    .SetInferDtypeFn(PD_INFER_DTYPE(SelectDtypes));

PD_BUILD_OP(fleetlite_topk_bucket_select_accumulated)
    .Inputs({paddle::Vec("X"), paddle::Vec("Residual")})
    .Outputs({"Values", "Indices", paddle::Vec("ResidualOut")})
    .Attrs({"ks: std::vector<int>", "strides: std::vector<int>", "targets: std::vector<int>",
            "iterations: int64_t", "names: std::vector<std::string>", "wire_float16: bool"})
    .SetInplaceMap({{paddle::Vec("Residual"), paddle::Vec("ResidualOut")}})
    .SetKernelFn(PD_KERNEL(TopkBucketSelectAccumulated))
    .SetInferShapeFn(PD_INFER_SHAPE(SelectAccumulatedShapes))
    .SetInferDtypeFn(PD_INFER_DTYPE(SelectAccumulatedDtypes));

PD_BUILD_OP(fleetlite_topk_bucket_scatter)
    .Inputs({paddle::Vec("X"), "Values", "Indices"})
    .Outputs({paddle::Vec("XOut")})
    .Attrs({"scale: float"})
    .SetInplaceMap({{paddle::Vec("X"), paddle::Vec("XOut")}})
    .SetKernelFn(PD_KERNEL(TopkBucketScatter))
    .SetInferShapeFn(PD_INFER_SHAPE(ScatterShapes))
    .SetInferDtypeFn(PD_INFER_DTYPE(ScatterDtypes));


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
