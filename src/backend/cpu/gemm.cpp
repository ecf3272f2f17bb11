// The CPU GEMM kernel: oneDNN's matmul primitive, addressed through strides so transposed
// operands and broadcast (stride 0) batches need no copies. alpha is an output scale and beta a
// sum post-op. Primitives are created once per (shape, strides, dtype, flags, alpha, beta) and
// cached, so a repeated call costs a hash lookup on top of oneDNN's own execute.
#include <array>
#include <bit>
#include <memory>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <unordered_map>

#include "backend/cpu/cpu.h"
#include "ops/matmul.h"

namespace myriad::cpu {
namespace {
using ops::GemmArgs;
using dt = dnnl::memory::data_type;
using dims = dnnl::memory::dims;

dnnl::engine& engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}
// CPU streams execute synchronously in the calling thread and keep no state between calls,
// so one serves every thread.
dnnl::stream& stream() {
  static dnnl::stream s(engine());
  return s;
}

using Key = std::array<int64_t, 15>;
struct KeyHash {
  size_t operator()(const Key& k) const {
    uint64_t h = 1469598103934665603ull;
    for (int64_t v : k) h = (h ^ static_cast<uint64_t>(v)) * 1099511628211ull;
    return h;
  }
};

Key key_of(const GemmArgs& g) {
  Key k = {g.batch, g.m, g.n, g.k, g.trans_a, g.trans_b, g.lda, g.ldb, g.ldc};
  k[9] = g.stride_a, k[10] = g.stride_b, k[11] = g.stride_c;
  k[12] = std::bit_cast<int32_t>(g.alpha), k[13] = std::bit_cast<int32_t>(g.beta);
  k[14] = static_cast<int64_t>(g.dtype);
  return k;
}

// The memory descriptor of op(X) as a rows x cols matrix (per batch): row-major with leading
// dimension ld, or stored transposed. A stride-0 batch becomes a batch of 1 that oneDNN
// broadcasts.
dnnl::memory::desc operand_md(int64_t batch, int64_t rows, int64_t cols, bool trans, int64_t ld,
                              int64_t bstride, dt type) {
  const int64_t rs = trans ? 1 : ld, cs = trans ? ld : 1;
  if (batch == 1) return dnnl::memory::desc(dims{rows, cols}, type, dims{rs, cs});
  return dnnl::memory::desc(dims{bstride == 0 ? 1 : batch, rows, cols}, type,
                            dims{bstride == 0 ? rows * cols : bstride, rs, cs});
}

struct Entry {
  dnnl::matmul prim;
  dnnl::memory::desc a, b, c;
};

std::shared_ptr<const Entry> create(const GemmArgs& g) {
  const dt type = g.dtype == DType::F32 ? dt::f32 : dt::bf16;
  auto a = operand_md(g.batch, g.m, g.k, g.trans_a, g.lda, g.stride_a, type);
  auto b = operand_md(g.batch, g.k, g.n, g.trans_b, g.ldb, g.stride_b, type);
  auto c = operand_md(g.batch, g.m, g.n, false, g.ldc, g.stride_c, type);
  dnnl::primitive_attr attr;
  if (g.alpha != 1.0f) attr.set_output_scales(0, {g.alpha});
  if (g.beta != 0.0f) {
    dnnl::post_ops po;
    po.append_sum(g.beta);
    attr.set_post_ops(po);
  }
  dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, c), attr, engine());
  return std::make_shared<const Entry>(Entry{dnnl::matmul(pd), a, b, c});
}

// Both caches are simply emptied when full: shapes in a training run are few, and a miss only
// costs a creation (which oneDNN's own primitive cache often serves).
constexpr size_t kMaxEntries = 4096;

// The process-wide primitives, shared by all threads.
std::shared_ptr<const Entry> shared_entry(const Key& key, const GemmArgs& g) {
  static std::mutex mu;
  static std::unordered_map<Key, std::shared_ptr<const Entry>, KeyHash> map;
  {
    std::lock_guard lock(mu);
    auto it = map.find(key);
    if (it != map.end()) return it->second;
  }
  auto e = create(g);  // outside the lock: creation can take a while
  std::lock_guard lock(mu);
  if (map.size() >= kMaxEntries) map.clear();
  return map.emplace(key, e).first->second;
}

// Per thread: the primitives this thread ran, with memory objects whose data handles are
// rebound on each call, so the steady state takes no lock and allocates nothing.
struct Bound {
  std::shared_ptr<const Entry> e;
  std::unordered_map<int, dnnl::memory> args;
};

Bound& bound_for(const GemmArgs& g) {
  thread_local std::unordered_map<Key, Bound, KeyHash> local;
  Key key = key_of(g);
  auto it = local.find(key);
  if (it != local.end()) return it->second;
  if (local.size() >= kMaxEntries) local.clear();
  Bound b{shared_entry(key, g), {}};
  b.args = {{DNNL_ARG_SRC, dnnl::memory(b.e->a, engine(), DNNL_MEMORY_NONE)},
            {DNNL_ARG_WEIGHTS, dnnl::memory(b.e->b, engine(), DNNL_MEMORY_NONE)},
            {DNNL_ARG_DST, dnnl::memory(b.e->c, engine(), DNNL_MEMORY_NONE)}};
  return local.emplace(key, std::move(b)).first->second;
}

// K = 0: the product is empty, C = beta * C.
void scale_c(const GemmArgs& g) {
  for (int64_t bi = 0; bi < g.batch; ++bi)
    for (int64_t i = 0; i < g.m; ++i)
      for (int64_t j = 0; j < g.n; ++j) {
        int64_t o = bi * g.stride_c + i * g.ldc + j;
        if (g.dtype == DType::F32) {
          float* c = static_cast<float*>(g.c) + o;
          *c = g.beta == 0.0f ? 0.0f : g.beta * *c;
        } else {
          uint16_t* c = static_cast<uint16_t*>(g.c) + o;
          *c = bf16_store(g.beta == 0.0f ? 0.0f : g.beta * bf16_load(*c));
        }
      }
}

void gemm_cpu(const GemmArgs& g) {
  MYRIAD_CHECK(g.dtype == DType::F32 || g.dtype == DType::BF16,
               "matmul: the cpu kernel supports f32 and bf16, not ", dtype_name(g.dtype));
  if (g.k == 0) return scale_c(g);
  Bound& b = bound_for(g);
  b.args[DNNL_ARG_SRC].set_data_handle(const_cast<void*>(g.a));
  b.args[DNNL_ARG_WEIGHTS].set_data_handle(const_cast<void*>(g.b));
  b.args[DNNL_ARG_DST].set_data_handle(g.c);
  b.e->prim.execute(stream(), b.args);
}

}  // namespace

MYRIAD_REGISTER_KERNEL(ops::gemm_kernels, ops::Backend::CPU, &gemm_cpu);

}  // namespace myriad::cpu
