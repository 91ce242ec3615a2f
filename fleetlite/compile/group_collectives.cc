// Collectives on a gloo sub-group communicator, for static CPU programs.
// fleetlite/compile/group_collectives.py builds and loads them and says why they exist.
//
// Paddle's CPU collective kernels ignore their ring_id: they use the one communicator attached
// to the process's CPU device context. These operators look their communicator up by key in
// Paddle's CommContextManager instead (fleetlite.runtime.subgroups creates one per group, under
// non-integer keys such as "fleetlite/1/0.1", so no native op's ring_id can resolve to them):
//   fleetlite_group_all_reduce(X) -> Out          the group's sum
//   fleetlite_group_all_gather(X) -> Out          the members' X stacked along axis 0
//   fleetlite_group_broadcast(X) -> Out           the X of group member `root`
//   fleetlite_group_reduce_scatter(X) -> Out      this member's 1/nranks (axis 0) of the group's
//                                                 sum, by a ring of point-to-point steps (gloo's
//                                                 context has no reduce-scatter; see ReduceScatter)
// Each carries an int attribute named `ring_id` (always 0): Paddle's executor treats an op with
// that attribute as a communication op and keeps it in program order with the others (without
// it, independent ones ran concurrently and gloo failed).
//
// fleetlite_bind_world_ring() (plain C, called through ctypes): attach ring 0 (the world) to the
// CPU device context again. An eager paddle._C_ops collective on another ring leaves that ring
// attached, and every later static ring-0 collective of the process would then run on it.
#include <string>
#include <vector>

#include "paddle/common/exception.h"
#include "paddle/phi/api/all.h"
#include "paddle/phi/backends/context_pool.h"
#include "paddle/phi/core/dense_tensor.h"
#include "paddle/phi/core/distributed/comm_context_manager.h"
#include "paddle/phi/core/distributed/gloo_comm_context.h"  // with the gloo stubs of group_collectives.py

namespace {
using phi::distributed::CommContextManager;
using phi::distributed::GlooCommContext;

constexpr int kSum = 0;   // phi::ReduceType::kRedSum

GlooCommContext* Comm(const std::string& key, int nranks) {
  auto& manager = CommContextManager::GetInstance();
  PD_CHECK(manager.Has(key), "no gloo communicator '", key,
           "' in this process: fleetlite creates them before a program that uses them runs");
  auto* comm = static_cast<GlooCommContext*>(manager.Get(key));
  PD_CHECK(comm->GetSize() == nranks, "communicator '", key, "' has ", comm->GetSize(), " ranks, not ", nranks);
  return comm;
}

phi::DenseTensor* Dense(const paddle::Tensor& t) { return static_cast<phi::DenseTensor*>(t.impl().get()); }

std::vector<paddle::Tensor> AllReduce(const paddle::Tensor& x, const std::string& comm_key, int nranks, int) {
  auto out = paddle::empty(x.shape(), x.dtype(), x.place());
  Comm(comm_key, nranks)->AllReduce(Dense(out), *Dense(x), kSum);
  return {out};
}

std::vector<paddle::Tensor> AllGather(const paddle::Tensor& x, const std::string& comm_key, int nranks, int) {
  auto shape = x.shape();
  shape[0] *= nranks;
  auto out = paddle::empty(shape, x.dtype(), x.place());
  Comm(comm_key, nranks)->AllGather(Dense(out), *Dense(x));
  return {out};
}

std::vector<paddle::Tensor> Broadcast(const paddle::Tensor& x, const std::string& comm_key, int nranks, int root,
                                      int) {
  auto out = paddle::empty(x.shape(), x.dtype(), x.place());
  Comm(comm_key, nranks)->Broadcast(Dense(out), *Dense(x), root);
  return {out};
}

// Chunk `chunk` of x's rows, sharing x's memory.
paddle::Tensor Rows(const paddle::Tensor& x, int64_t chunk, int64_t rows) {
  return x.slice(chunk * rows, (chunk + 1) * rows);
}

// A ring reduce-scatter, nranks - 1 steps: at step s member r sends its partial sum of chunk
// r - s - 1 (mod nranks; at step 0 its own rows of X) to member r + 1, receives member r - 1's
// partial sum of chunk r - s - 2 and adds its own rows of that chunk; after the last step it holds
// chunk r summed over the group. Each member sends (nranks - 1) chunks and adds as many: half of
// what an all-reduce then a slice sends and adds. Send and Recv each wait for the peer, so even
// members send first and odd ones receive first: no cycle of members all waiting to send.
std::vector<paddle::Tensor> ReduceScatter(const paddle::Tensor& x, const std::string& comm_key, int nranks, int) {
  auto* comm = Comm(comm_key, nranks);
  PD_CHECK(x.shape()[0] % nranks == 0, "reduce_scatter: ", x.shape()[0], " rows do not split into ", nranks);
  if (nranks == 1) return {x.copy_to(x.place(), true)};
  const int64_t rows = x.shape()[0] / nranks, rank = comm->GetRank();
  const int next = (rank + 1) % nranks, previous = (rank + nranks - 1) % nranks;
  auto shape = x.shape();
  shape[0] = rows;
  auto received = paddle::empty(shape, x.dtype(), x.place());
  paddle::Tensor partial = Rows(x, previous, rows);
  for (int64_t step = 0; step + 1 < nranks; ++step) {
    const int64_t chunk = (rank - step - 2 + 2 * nranks) % nranks;
    if (rank % 2 == 0) comm->Send(*Dense(partial), next, step);
    comm->Recv(Dense(received), previous, step);
    if (rank % 2 != 0) comm->Send(*Dense(partial), next, step);
    partial = paddle::experimental::add(Rows(x, chunk, rows), received);
  }
  return {partial};
}

std::vector<std::vector<int64_t>> SameShape(const std::vector<int64_t>& x) { return {x}; }

std::vector<std::vector<int64_t>> GatherShape(const std::vector<int64_t>& x, const std::string&, int nranks, int) {
  auto shape = x;
  if (shape[0] >= 0) shape[0] *= nranks;
  return {shape};
}

std::vector<std::vector<int64_t>> ScatterShape(const std::vector<int64_t>& x, const std::string&, int nranks, int) {
  auto shape = x;
  if (shape[0] >= 0) shape[0] /= nranks;
  return {shape};
}

std::vector<paddle::DataType> SameDtype(const paddle::DataType& t) { return {t}; }
}  // namespace

extern "C" int fleetlite_bind_world_ring() {
  auto& manager = CommContextManager::GetInstance();
  if (!manager.Has("0")) return 0;
  phi::DeviceContextPool::Instance().Get(phi::CPUPlace())->SetCommContext(manager.Get("0"));
  return 1;
}

PD_BUILD_OP(fleetlite_group_all_reduce)
    .Inputs({"X"}).Outputs({"Out"}).Attrs({"comm_key: std::string", "nranks: int", "ring_id: int"})
    .SetKernelFn(PD_KERNEL(AllReduce)).SetInferShapeFn(PD_INFER_SHAPE(SameShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(SameDtype));

PD_BUILD_OP(fleetlite_group_all_gather)
    .Inputs({"X"}).Outputs({"Out"}).Attrs({"comm_key: std::string", "nranks: int", "ring_id: int"})
    .SetKernelFn(PD_KERNEL(AllGather)).SetInferShapeFn(PD_INFER_SHAPE(GatherShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(SameDtype));

PD_BUILD_OP(fleetlite_group_broadcast)
    .Inputs({"X"}).Outputs({"Out"}).Attrs({"comm_key: std::string", "nranks: int", "root: int", "ring_id: int"})
    .SetKernelFn(PD_KERNEL(Broadcast)).SetInferShapeFn(PD_INFER_SHAPE(SameShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(SameDtype));

PD_BUILD_OP(fleetlite_group_reduce_scatter)
    .Inputs({"X"}).Outputs({"Out"}).Attrs({"comm_key: std::string", "nranks: int", "ring_id: int"})
    .SetKernelFn(PD_KERNEL(ReduceScatter)).SetInferShapeFn(PD_INFER_SHAPE(ScatterShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(SameDtype));
