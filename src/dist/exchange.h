// Differentiable row exchange between the ranks of a communicator: the all-to-all-v that expert
// parallelism dispatches tokens and combines outputs with (docs/DISTRIBUTED.md).
#pragma once
#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "dist/comm.h"

namespace myriad::dist {

// Rows of x_MD go to the ranks of `c`: the first send_rows[0] rows to rank 0, the next
// send_rows[1] to rank 1, and so on; the result stacks the rows received, recv_rows[q] from rank q,
// in rank order (recv_rows[q] must equal what rank q sends here). Differentiable: the backward
// sends the gradients back the reverse way under the same collective name, so it is a collective
// too, and every rank must run its backward pass in step with the others.
Tensor exchange_rows(Comm& c, const char* name, const Tensor& x_MD,
                     const std::vector<int64_t>& send_rows, const std::vector<int64_t>& recv_rows);

}  // namespace myriad::dist
