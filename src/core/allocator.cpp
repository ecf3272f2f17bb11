#include "core/allocator.h"

#include <array>
#include <bit>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

#include "core/error.h"

namespace myriad {
namespace {

// Caching CPU arena: blocks are rounded up to a size class (powers of two split in four steps
// above 4 KiB) and kept on a free list per class, so the training loop's steady state makes no
// system calls. Very large blocks (over 1 GiB) go straight to the system.
class CpuArena final : public Allocator {
 public:
  ~CpuArena() override { empty_cache(); }

  static size_t size_class(size_t bytes) {
    if (bytes <= 4096) return std::max<size_t>(64, std::bit_ceil(bytes));
    size_t p = std::bit_floor(bytes);
    size_t step = p / 4;
    return (bytes + step - 1) / step * step;
  }

  void* allocate(size_t bytes, int) override {
    size_t sz = size_class(std::max<size_t>(bytes, 1));
    std::lock_guard lock(mu_);
    ++st_.allocs;
    void* p = nullptr;
    auto it = free_.find(sz);
    if (it != free_.end() && !it->second.empty()) {
      p = it->second.back();
      it->second.pop_back();
      st_.cached -= sz;
    } else {
      p = std::aligned_alloc(64, sz);
      MYRIAD_CHECK(p, "cpu allocator: out of memory allocating ", bytes, " bytes (in use ",
                   st_.in_use, ")");
      ++st_.os_allocs;
    }
    st_.in_use += sz;
    st_.peak = std::max(st_.peak, st_.in_use);
    return p;
  }

  void deallocate(void* p, size_t bytes, int) override {
    size_t sz = size_class(std::max<size_t>(bytes, 1));
    std::lock_guard lock(mu_);
    st_.in_use -= sz;
    if (sz > (size_t{1} << 30)) {
      std::free(p);
      return;
    }
    free_[sz].push_back(p);
    st_.cached += sz;
  }

  void empty_cache() override {
    std::lock_guard lock(mu_);
    for (auto& [sz, list] : free_)
      for (void* p : list) std::free(p);
    free_.clear();
    st_.cached = 0;
  }

  AllocatorStats stats() const override {
    std::lock_guard lock(mu_);
    return st_;
  }

  void copy(void* dst, const void* src, size_t bytes, Copy, int) override {
    if (bytes) std::memcpy(dst, src, bytes);
  }

 private:
  mutable std::mutex mu_;
  std::map<size_t, std::vector<void*>> free_;
  AllocatorStats st_;
};

std::array<Allocator*, kNumDeviceTypes>& table() {
  static CpuArena* cpu = new CpuArena();  // leaked on purpose: outlives static tensors
  static std::array<Allocator*, kNumDeviceTypes> t{cpu, nullptr};
  return t;
}

}  // namespace

Allocator& allocator_for(DeviceType t) {
  Allocator* a = table()[static_cast<int>(t)];
  MYRIAD_CHECK(a, "device type ", t == DeviceType::CUDA ? "cuda" : "cpu",
               " is not available: this build has no backend for it (configure with CUDA)");
  return *a;
}
bool has_allocator(DeviceType t) {
  return table()[static_cast<int>(t)] != nullptr;
}
void register_allocator(DeviceType t, Allocator* a) {
  table()[static_cast<int>(t)] = a;
}

Storage::Storage(size_t bytes, Device device) : bytes_(bytes), device_(device) {
  data_ = allocator_for(device.type).allocate(bytes, device.index);
}
Storage::~Storage() {
  allocator_for(device_.type).deallocate(data_, bytes_, device_.index);
}

}  // namespace myriad
