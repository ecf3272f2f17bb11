#include "train/expert_parallel.h"

#include "core/error.h"
#include "dist/exchange.h"
#include "ops/ops.h"

namespace myriad::train {

std::pair<int64_t, int64_t> ExpertParallel::local_experts(int64_t n) const {
  const int64_t E = comm_.size();
  MYRIAD_CHECK(n % E == 0, "expert parallel: ", n, " experts do not divide over ep = ", E);
  return {comm_.rank() * (n / E), n / E};
}

Tensor ExpertParallel::run(const model::Moe& moe, const Tensor& xs_MD,
                           const std::vector<int64_t>& counts) const {
  const int64_t n = moe.num_experts(), E = comm_.size();
  const auto [first, per] = local_experts(n);
  MYRIAD_CHECK(static_cast<int64_t>(counts.size()) == n, "expert parallel: ", counts.size(),
               " counts for ", n, " experts");
  // Rows per destination: the experts are in blocks, so each rank's rows are contiguous already.
  std::vector<int64_t> send_rows(static_cast<size_t>(E), 0);
  for (int64_t j = 0; j < n; ++j) send_rows[static_cast<size_t>(j / per)] += counts[j];
  // Each rank learns how many rows of each of its experts every rank sends: got[q * per + i].
  std::vector<int64_t> got(static_cast<size_t>(E * per));
  const std::vector<size_t> bytes(static_cast<size_t>(E), static_cast<size_t>(per) * 8);
  comm_.all_to_all("ep_counts", counts.data(), bytes, got.data(), bytes);
  std::vector<int64_t> recv_rows(static_cast<size_t>(E), 0), local(static_cast<size_t>(per), 0);
  for (int64_t q = 0; q < E; ++q)
    for (int64_t i = 0; i < per; ++i) {
      recv_rows[static_cast<size_t>(q)] += got[static_cast<size_t>(q * per + i)];
      local[static_cast<size_t>(i)] += got[static_cast<size_t>(q * per + i)];
    }
  Tensor recv = dist::exchange_rows(comm_, "ep_dispatch", xs_MD, send_rows, recv_rows);
  // The received rows come by source rank, then expert; the grouped GEMM wants them by expert,
  // then source rank. perm[p] is the received row at expert-major position p.
  std::vector<int64_t> start(static_cast<size_t>(E * per)), perm,
      inv(static_cast<size_t>(recv.size(0)));
  for (int64_t at = 0, c = 0; c < E * per; ++c)
    start[static_cast<size_t>(c)] = at, at += got[static_cast<size_t>(c)];
  perm.reserve(inv.size());
  for (int64_t i = 0; i < per; ++i)
    for (int64_t q = 0; q < E; ++q) {
      const auto c = static_cast<size_t>(q * per + i);
      for (int64_t r = 0; r < got[c]; ++r) perm.push_back(start[c] + r);
    }
  for (size_t p = 0; p < perm.size(); ++p)
    inv[static_cast<size_t>(perm[p])] = static_cast<int64_t>(p);
  const auto index = [&](const std::vector<int64_t>& v) {
    return Tensor::from_ints(v, {static_cast<int64_t>(v.size())}, DType::I64, recv.device());
  };
  const bool reorder = E > 1 && per > 1 && !perm.empty();
  Tensor xe = reorder ? ops::index_select(recv, 0, index(perm)) : recv;
  Tensor ye = moe.run_experts(xe, local, first);
  Tensor yr = reorder ? ops::index_select(ye, 0, index(inv)) : ye;
  return dist::exchange_rows(comm_, "ep_combine", yr, recv_rows, send_rows);
}

}  // namespace myriad::train
