// Scratch buffers for a CPU kernel's per-thread tiles, each starting on its own cache line
// modulo 4 KiB. A kernel's passes read some tiles and write others at the same index; tiles
// of 16 KiB allocated one after another as std::vectors start 16 bytes apart modulo 4 KiB,
// and a load then waits for an unrelated earlier store whose address matches it in the low 12
// bits (4K aliasing). In the KDA chunk kernel that cost the forward 1.22x and forward+backward
// 1.25x (docs/PERFORMANCE.md).
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <memory>

#include "core/error.h"

namespace myriad::cpu {

// n values of `init`, starting (5 slot mod 64) cache lines past a 4 KiB boundary: up to 64
// buffers made with consecutive slots start on different lines, neighbours 5 lines apart. Each
// constructor takes the next slot from the counter it is given.
template <class T>
class Scratch {
 public:
  Scratch() = default;
  Scratch(int64_t n, int& slot, T init = T{}) : n_(n) {
    const int64_t off = (slot++ * 5 % 64) * 64;  // bytes
    if (n == 0) return;                          // (data() is null, as for an empty vector)
    const size_t bytes = (off + n * sizeof(T) + 4095) / 4096 * 4096;
    mem_.reset(static_cast<char*>(std::aligned_alloc(4096, bytes)));
    MYRIAD_CHECK(mem_ != nullptr, "out of memory for a ", bytes, "-byte scratch buffer");
    p_ = reinterpret_cast<T*>(mem_.get() + off);
    std::fill(p_, p_ + n, init);
  }
  T* data() const { return p_; }
  T* begin() const { return p_; }
  T* end() const { return p_ + n_; }
  int64_t size() const { return n_; }
  T& operator[](int64_t i) const { return p_[i]; }

 private:
  struct Free {
    void operator()(char* p) const { std::free(p); }
  };
  std::unique_ptr<char, Free> mem_;
  T* p_ = nullptr;
  int64_t n_ = 0;
};

}  // namespace myriad::cpu
