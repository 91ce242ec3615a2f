// Copy-free gradient buckets on CPU: two in-place operators around a bucket's all_reduce_.
// fleetlite/compile/bucket_views.py builds and loads them and says why the design holds.
//
// fleetlite_bucket_pack(X[], Buf) -> BufOut (in place on Buf), attribute `scale`:
//   each member X[i] belongs at its slot of Buf (members back to back, in order). A member that
//   already lies in its slot is left alone (times `scale` if it is not 1); any other is copied in
//   (times `scale`), and its variable is re-pointed at the slot, so the backward kernel that
//   writes it at the next step writes straight into the slot (Paddle keeps an output's holder
//   when it is large enough, and fleetlite keeps the variable alive by marking it persistable).
// fleetlite_bucket_alias(Buf, X[]) -> XOut[] (in place on X): after the all-reduce, each XOut[i]
//   is its slot of the reduced Buf. The executor has already shared X[i]'s memory with XOut[i]:
//   where that is the slot (the pack re-pointed it) nothing is done; otherwise the slot is copied
//   out, so the result is right whatever the executor did with the member.
//
// Both count what they did (members found in place, members copied) for
// fleetlite_bucket_counts(), which bucket_views.py reads through ctypes: the check that the
// steady state is copy-free.
#include <atomic>
#include <cstring>
#include <vector>

// paddle/extension.h would add PIR pass and pybind headers: 3x the compile time, none used here.
#include "paddle/common/exception.h"
#include "paddle/phi/api/all.h"
#include "paddle/phi/core/dense_tensor.h"

namespace {

std::atomic<int64_t> packed_in_place{0}, packed_copied{0}, aliased_in_place{0}, aliased_copied{0};

std::shared_ptr<phi::DenseTensor> Dense(const paddle::Tensor& t) {
  auto dense = std::dynamic_pointer_cast<phi::DenseTensor>(t.impl());
  PD_CHECK(dense != nullptr, "fleetlite bucket ops take dense tensors only");
  return dense;
}

template <typename T>
void Scale(T* data, int64_t n, float scale) {
  const T factor = static_cast<T>(scale);
  for (int64_t i = 0; i < n; ++i) data[i] *= factor;
}

template <typename T>
void ScaledCopy(T* to, const T* from, int64_t n, float scale) {
  if (scale == 1.0f) {
    std::memcpy(to, from, n * sizeof(T));
    return;
  }
  const T factor = static_cast<T>(scale);
  for (int64_t i = 0; i < n; ++i) to[i] = from[i] * factor;
}

// Make `member` a view of `bucket`'s elements [offset, offset + numel), keeping its shape.
void PointAtSlot(phi::DenseTensor* member, const phi::DenseTensor& bucket, int64_t offset, size_t element_size) {
  const phi::DDim dims = member->dims();
  member->ShareDataWith(bucket);
  phi::DenseTensorMeta meta = member->meta();
  meta.dims = dims;
  meta.offset = bucket.meta().offset + offset * element_size;
  meta.strides = meta.calc_strides(dims);
  member->set_meta(meta);
}

template <typename T>
void PackMembers(std::vector<paddle::Tensor>& xs, phi::DenseTensor* bucket, float scale) {
  T* base = bucket->data<T>();
  int64_t offset = 0;
  for (auto& x : xs) {
    auto member = Dense(x);
    const int64_t n = member->numel();
    PD_CHECK(offset + n <= bucket->numel(), "fleetlite_bucket_pack: members overrun the bucket");
    T* slot = base + offset;
    if (member->data<T>() == slot) {
      if (scale != 1.0f) Scale(slot, n, scale);
      ++packed_in_place;
    } else {
      ScaledCopy(slot, member->data<T>(), n, scale);
      PointAtSlot(member.get(), *bucket, offset, sizeof(T));
      ++packed_copied;
    }
    offset += n;
  }
  PD_CHECK(offset == bucket->numel(), "fleetlite_bucket_pack: members fill ", offset, " of the bucket's ",
           bucket->numel(), " elements");
}

template <typename T>
void AliasMembers(const phi::DenseTensor& bucket, std::vector<paddle::Tensor>& xs) {
  const T* base = bucket.data<T>();
  int64_t offset = 0;
  for (auto& x : xs) {
    auto member = Dense(x);
    const int64_t n = member->numel();
    PD_CHECK(offset + n <= bucket.numel(), "fleetlite_bucket_alias: members overrun the bucket");
    const T* slot = base + offset;
    if (member->data<T>() == slot) {
      ++aliased_in_place;
    } else {
      std::memcpy(member->data<T>(), slot, n * sizeof(T));
      ++aliased_copied;
    }
    offset += n;
  }
}

}  // namespace

void BucketPack(std::vector<paddle::Tensor>& xs, paddle::Tensor& buf, float scale) {
  PD_CHECK(buf.is_cpu(), "fleetlite_bucket_pack runs on CPU tensors only");
  auto bucket = Dense(buf);
  PD_DISPATCH_FLOATING_TYPES(buf.dtype(), "fleetlite_bucket_pack",
                             ([&] { PackMembers<data_t>(xs, bucket.get(), scale); }));
}

void BucketAlias(const paddle::Tensor& buf, std::vector<paddle::Tensor>& xs) {
  PD_CHECK(buf.is_cpu(), "fleetlite_bucket_alias runs on CPU tensors only");
  auto bucket = Dense(buf);
  PD_DISPATCH_FLOATING_TYPES(buf.dtype(), "fleetlite_bucket_alias", ([&] { AliasMembers<data_t>(*bucket, xs); }));
}

std::vector<std::vector<int64_t>> PackShapes(const std::vector<std::vector<int64_t>>& xs,
                                             const std::vector<int64_t>& buf, float scale) {
  return {buf};
}

std::vector<paddle::DataType> PackDtypes(const std::vector<paddle::DataType>& xs, const paddle::DataType& buf) {
  return {buf};
}

std::vector<std::vector<int64_t>> AliasShapes(const std::vector<int64_t>& buf,
                                              const std::vector<std::vector<int64_t>>& xs) {
  return xs;
}

std::vector<paddle::DataType> AliasDtypes(const paddle::DataType& buf, const std::vector<paddle::DataType>& xs) {
  return xs;
}

PD_BUILD_OP(fleetlite_bucket_pack)
    .Inputs({paddle::Vec("X"), "Buf"})
    .Outputs({"BufOut"})
    .Attrs({"scale: float"})
    .SetInplaceMap({{"Buf", "BufOut"}})
    .SetKernelFn(PD_KERNEL(BucketPack))
    .SetInferShapeFn(PD_INFER_SHAPE(PackShapes))
    .SetInferDtypeFn(PD_INFER_DTYPE(PackDtypes));

PD_BUILD_OP(fleetlite_bucket_alias)
    .Inputs({"Buf", paddle::Vec("X")})
    .Outputs({paddle::Vec("XOut")})
    .SetInplaceMap({{paddle::Vec("X"), paddle::Vec("XOut")}})
    .SetKernelFn(PD_KERNEL(BucketAlias))
    .SetInferShapeFn(PD_INFER_SHAPE(AliasShapes))
    .SetInferDtypeFn(PD_INFER_DTYPE(AliasDtypes));

// [packed in place, packed by copy, aliased in place, aliased by copy] since the library loaded.
extern "C" void fleetlite_bucket_counts(int64_t* counts) {
  counts[0] = packed_in_place;
  counts[1] = packed_copied;
  counts[2] = aliased_in_place;
  counts[3] = aliased_copied;
}
