#include "dist/exchange.h"

#include <numeric>

#include "core/autograd.h"
#include "core/error.h"

namespace myriad::dist {

Tensor exchange_rows(Comm& c, const char* name, const Tensor& x_MD,
                     const std::vector<int64_t>& send_rows, const std::vector<int64_t>& recv_rows) {
  const auto W = static_cast<size_t>(c.size());
  MYRIAD_CHECK(x_MD.dim() == 2, "exchange_rows: rows [M, D], got ", x_MD.desc());
  MYRIAD_CHECK(send_rows.size() == W && recv_rows.size() == W, "exchange_rows: ", W, " ranks need ",
               W, " send and receive counts");
  const int64_t M = std::accumulate(send_rows.begin(), send_rows.end(), int64_t{0});
  const int64_t R = std::accumulate(recv_rows.begin(), recv_rows.end(), int64_t{0});
  MYRIAD_CHECK(M == x_MD.size(0), "exchange_rows: sending ", M, " rows of ", x_MD.size(0));
  const int64_t D = x_MD.size(1);
  const size_t row = static_cast<size_t>(D) * dtype_size(x_MD.dtype());
  // The collective works on host memory; a device tensor goes through a host copy.
  const Tensor h = x_MD.detach().to(kCPU).contiguous();
  Tensor out = Tensor::empty({R, D}, x_MD.dtype(), kCPU);
  std::vector<size_t> sb(W), rb(W);
  for (size_t q = 0; q < W; ++q) {
    MYRIAD_CHECK(send_rows[q] >= 0 && recv_rows[q] >= 0, "exchange_rows: negative row count");
    sb[q] = static_cast<size_t>(send_rows[q]) * row;
    rb[q] = static_cast<size_t>(recv_rows[q]) * row;
  }
  c.all_to_all(name, h.data_ptr(), sb, out.data_ptr(), rb);
  if (x_MD.device() != kCPU) out = out.to(x_MD.device());
  if (needs_grad({&x_MD}))
    record("exchange_rows", out, {x_MD},
           [&c, name, send_rows, recv_rows](const Tensor& g) -> std::vector<Tensor> {
             return {exchange_rows(c, name, g, recv_rows, send_rows)};
           });
  return out;
}

}  // namespace myriad::dist
