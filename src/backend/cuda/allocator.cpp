// Caching CUDA allocator: sizes are rounded (512 B below 1 MiB, 2 MiB above) and freed blocks
// wait on a free list per (device, size) for reuse, so the training loop's steady state makes no
// cudaMalloc/cudaFree calls (both synchronise the device). Blocks are reused without waiting
// because all work of the backend runs in order on one stream per device. Registered only when
// a device is visible, so has_allocator(DeviceType::CUDA) tells whether CUDA can be used.
#include <algorithm>
#include <map>
#include <mutex>
#include <vector>

#include "backend/cuda/cuda.h"
#include "core/allocator.h"
#include "core/error.h"

namespace myriad::gpu {
namespace {

constexpr size_t kSmall = 512, kLarge = size_t{2} << 20, kLargeFrom = size_t{1} << 20;

class CudaAllocator final : public Allocator {
 public:
  CudaAllocator() : free_(device_count()) {}

  static size_t round_size(size_t bytes) {
    size_t unit = bytes < kLargeFrom ? kSmall : kLarge;
    return (std::max<size_t>(bytes, 1) + unit - 1) / unit * unit;
  }

  void* allocate(size_t bytes, int device) override {
    check_device(device);
    const size_t sz = round_size(bytes);
    std::lock_guard lock(mu_);
    ++st_.allocs;
    void* p = nullptr;
    auto& list = free_[device][sz];
    if (!list.empty()) {
      p = list.back();
      list.pop_back();
      st_.cached -= sz;
    } else {
      DeviceGuard g(device);
      cudaError_t e = cudaMalloc(&p, sz);
      if (e == cudaErrorMemoryAllocation) {  // give the cache back and try once more
        cudaGetLastError();
        release_locked();
        e = cudaMalloc(&p, sz);
      }
      if (e != cudaSuccess) {
        cudaGetLastError();
        throw Error(cat("cuda allocator: cannot allocate ", bytes, " bytes on cuda:", device, " (",
                        cudaGetErrorString(e), "; in use ", st_.in_use, " bytes, peak ", st_.peak,
                        ")"));
      }
      ++st_.os_allocs;
    }
    st_.in_use += sz;
    st_.peak = std::max(st_.peak, st_.in_use);
    return p;
  }

  // Never calls CUDA (it runs in destructors, possibly at exit), so it cannot fail.
  void deallocate(void* p, size_t bytes, int device) override {
    const size_t sz = round_size(bytes);
    std::lock_guard lock(mu_);
    st_.in_use -= sz;
    st_.cached += sz;
    free_[device][sz].push_back(p);
  }

  void empty_cache() override {
    std::lock_guard lock(mu_);
    release_locked();
  }

  AllocatorStats stats() const override {
    std::lock_guard lock(mu_);
    return st_;
  }

  void copy(void* dst, const void* src, size_t bytes, Copy kind, int device) override {
    if (!bytes) return;
    check_device(device);
    const cudaMemcpyKind k = kind == Copy::HostToDevice   ? cudaMemcpyHostToDevice
                             : kind == Copy::DeviceToHost ? cudaMemcpyDeviceToHost
                                                          : cudaMemcpyDeviceToDevice;
    DeviceGuard g(device);
    cudaStream_t s = current_stream(device);
    // On the backend's stream (after the kernels that produced src), then wait: copies are sync.
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, k, s));
    CUDA_CHECK(cudaStreamSynchronize(s));
  }

 private:
  void check_device(int device) const {
    MYRIAD_CHECK(device >= 0 && device < static_cast<int>(free_.size()), "cuda:", device,
                 " is not a visible device (", free_.size(), " visible)");
  }

  // cudaFree waits for the device, so blocks still used by queued kernels are safe to free.
  void release_locked() {
    for (size_t d = 0; d < free_.size(); ++d) {
      DeviceGuard g(static_cast<int>(d));
      for (auto& [sz, list] : free_[d]) {
        for (void* p : list) CUDA_CHECK(cudaFree(p));
        st_.cached -= sz * list.size();
        list.clear();
      }
    }
  }

  mutable std::mutex mu_;
  std::vector<std::map<size_t, std::vector<void*>>> free_;  // per device: size -> blocks
  AllocatorStats st_;
};

// Constructed on first use and never destroyed: tensors in static storage may hand blocks back
// during exit, after this translation unit's statics would have been torn down.
CudaAllocator& instance() {
  union Holder {
    CudaAllocator a;
    Holder() : a() {}
    ~Holder() {}
  };
  static Holder h;
  return h.a;
}

const bool registered = [] {
  if (device_count() < 1) return false;
  register_allocator(DeviceType::CUDA, &instance());
  return true;
}();

}  // namespace
}  // namespace myriad::gpu
