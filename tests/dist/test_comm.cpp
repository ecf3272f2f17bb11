// The communicator's collectives on whatever backend world() is (docs/DISTRIBUTED.md): one
// process, MPI under mpirun, NCCL under MYRIAD_COMM=nccl (tools/gpu_check.sh). Uneven counts
// everywhere, since the trainer's shards are uneven; and the differentiable row exchange of
// expert parallelism, forward and backward.
#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>
#include <vector>

#include "core/autograd.h"
#include "dist/comm.h"
#include "dist/exchange.h"
#include "ops/ops.h"

namespace myriad::dist {
namespace {

TEST(Comm, AllReduceReduceScatterAllGather) {
  Comm& c = world();
  const int W = c.size(), me = c.rank();
  std::printf("[ Comm ] backend %s, %d rank(s)\n", c.backend().c_str(), W);
  // Integer and deterministic double sums.
  std::vector<int32_t> iv = {me + 1, 2 * me, -7};
  c.all_reduce_sum("t_i32", iv.data(), iv.size());
  EXPECT_EQ(iv[0], W * (W + 1) / 2);
  EXPECT_EQ(iv[1], W * (W - 1));
  EXPECT_EQ(iv[2], -7 * W);
  std::vector<double> dv = {0.5 * me, 1e-3};
  c.all_reduce_sum("t_f64", dv.data(), dv.size());
  EXPECT_DOUBLE_EQ(dv[0], 0.25 * W * (W - 1));
  // Reduce-scatter, rank r's slice r + 1 values (rank 0's of 3, to test padding both ways).
  std::vector<size_t> counts(static_cast<size_t>(W));
  for (int r = 0; r < W; ++r) counts[static_cast<size_t>(r)] = r == 0 ? 3 : static_cast<size_t>(r);
  std::vector<float> send;
  for (int r = 0; r < W; ++r)
    for (size_t k = 0; k < counts[static_cast<size_t>(r)]; ++k)
      send.push_back(static_cast<float>(100 * r + k + me));
  std::vector<float> got(counts[static_cast<size_t>(me)]);
  c.reduce_scatter_sum("t_rs", send.data(), got.data(), counts);
  for (size_t k = 0; k < got.size(); ++k)
    EXPECT_EQ(got[k], static_cast<float>(W * (100 * me + static_cast<int>(k)) + W * (W - 1) / 2))
        << k;
  // All-gather of uneven byte counts: rank r sends r + 2 bytes of value r.
  std::vector<size_t> bytes(static_cast<size_t>(W));
  for (int r = 0; r < W; ++r) bytes[static_cast<size_t>(r)] = static_cast<size_t>(r) + 2;
  std::vector<uint8_t> mine(bytes[static_cast<size_t>(me)], static_cast<uint8_t>(me));
  std::vector<uint8_t> all(std::accumulate(bytes.begin(), bytes.end(), size_t{0}));
  c.all_gather("t_ag", mine.data(), all.data(), bytes);
  size_t at = 0;
  for (int r = 0; r < W; ++r)
    for (size_t k = 0; k < bytes[static_cast<size_t>(r)]; ++k)
      EXPECT_EQ(all[at++], static_cast<uint8_t>(r));
}

TEST(Comm, AllToAllBroadcastSendRecvSplit) {
  Comm& c = world();
  const int W = c.size(), me = c.rank();
  // All-to-all: this rank sends rank q (me + q) % 3 bytes of value 16 me + q (none at all to some).
  auto n = [](int from, int to) { return static_cast<size_t>((from + to) % 3); };
  std::vector<size_t> sb(static_cast<size_t>(W)), rb(static_cast<size_t>(W));
  std::vector<uint8_t> send;
  for (int q = 0; q < W; ++q) {
    sb[static_cast<size_t>(q)] = n(me, q), rb[static_cast<size_t>(q)] = n(q, me);
    send.insert(send.end(), n(me, q), static_cast<uint8_t>(16 * me + q));
  }
  std::vector<uint8_t> recv(std::accumulate(rb.begin(), rb.end(), size_t{0}));
  c.all_to_all("t_a2a", send.data(), sb, recv.data(), rb);
  size_t at = 0;
  for (int q = 0; q < W; ++q)
    for (size_t k = 0; k < n(q, me); ++k) EXPECT_EQ(recv[at++], static_cast<uint8_t>(16 * q + me));
  // Broadcast from the last rank.
  std::vector<int64_t> b = {me == W - 1 ? 42 : -1, me == W - 1 ? 7 : -1};
  c.broadcast("t_bcast", b.data(), b.size() * sizeof(int64_t), W - 1);
  EXPECT_EQ(b, (std::vector<int64_t>{42, 7}));
  // A chain of send / recv: rank r receives r - 1's value and passes r's on.
  if (W > 1) {
    int64_t v = 1000 + me, from = -1;
    if (me % 2 == 0) {
      if (me + 1 < W) c.send("t_p2p", &v, sizeof v, me + 1);
      if (me > 0) c.recv("t_p2p", &from, sizeof from, me - 1);
    } else {
      c.recv("t_p2p", &from, sizeof from, me - 1);
      if (me + 1 < W) c.send("t_p2p", &v, sizeof v, me + 1);
    }
    if (me > 0) {
      EXPECT_EQ(from, 1000 + me - 1);
    }
  }
  // Split into even and odd ranks, ordered by descending rank; a sum inside each.
  std::unique_ptr<Comm> half = c.split(me % 2, -me);
  ASSERT_NE(half, nullptr);
  EXPECT_EQ(half->size(), (W + 1 - me % 2) / 2);
  int32_t s = me;
  half->all_reduce_sum("t_split", &s, 1);
  int32_t want = 0;
  for (int r = me % 2; r < W; r += 2) want += r;
  EXPECT_EQ(s, want);
  const int higher = (W - 1 - me) / 2;  // same-parity ranks above this one come first
  EXPECT_EQ(half->rank(), higher);
  half->barrier("t_barrier");
  c.barrier("t_barrier");
}

// Rows to the ranks (rank me sends rank q  q + 1 rows of width 3) and back: forward values, and
// the backward is the reverse exchange of the gradient.
TEST(Comm, ExchangeRowsIsDifferentiable) {
  Comm& c = world();
  const int W = c.size(), me = c.rank();
  std::vector<int64_t> send_rows, recv_rows;
  std::vector<float> x;
  for (int q = 0; q < W; ++q) {
    send_rows.push_back(q + 1), recv_rows.push_back(me + 1);
    for (int k = 0; k < q + 1; ++k)
      for (int d = 0; d < 3; ++d) x.push_back(static_cast<float>(100 * me + 10 * k + d + q * 1000));
  }
  Tensor xt = Tensor::from_floats(x, {static_cast<int64_t>(x.size() / 3), 3});
  xt.requires_grad_(true);
  const Tensor y = exchange_rows(c, "t_rows", xt, send_rows, recv_rows);
  ASSERT_EQ(y.size(0), static_cast<int64_t>(W) * (me + 1));
  const std::vector<float> yv = y.to_floats();
  for (int q = 0, row = 0; q < W; ++q)
    for (int k = 0; k <= me; ++k, ++row)
      for (int d = 0; d < 3; ++d)
        EXPECT_EQ(yv[static_cast<size_t>(row * 3 + d)],
                  static_cast<float>(100 * q + 10 * k + d + me * 1000));
  // d/dx sum(y * y) = 2 x, back on the rank that sent each row.
  ops::sum(ops::mul(y, y)).backward();
  const std::vector<float> g = xt.grad().to_floats();
  for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(g[i], 2 * x[i]) << i;
}

}  // namespace
}  // namespace myriad::dist
