// Per-device memory. Each device type has one Allocator; backends register theirs. The CPU one is
// a caching arena (size classes, 64-byte aligned); the CUDA one, registered by backend/cuda, a
// caching allocator over cudaMalloc. Storage hands its block back to the allocator it came from.
#pragma once
#include <cstddef>
#include <memory>

#include "core/device.h"

namespace myriad {

struct AllocatorStats {
  size_t in_use = 0;     // bytes handed out and not yet returned
  size_t cached = 0;     // bytes held in free lists for reuse
  size_t peak = 0;       // high-water mark of in_use
  size_t allocs = 0;     // calls to allocate
  size_t os_allocs = 0;  // of which went to the system (cache misses)
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(size_t bytes, int device_index) = 0;
  virtual void deallocate(void* p, size_t bytes, int device_index) = 0;
  virtual void empty_cache() = 0;  // give cached blocks back to the system
  virtual AllocatorStats stats() const = 0;
  // Copies bytes between this device and the host or within it (dst and src on this device type
  // or on the CPU, as the kind says).
  enum class Copy { HostToDevice, DeviceToHost, DeviceToDevice };
  virtual void copy(void* dst, const void* src, size_t bytes, Copy kind, int device_index) = 0;
};

Allocator& allocator_for(DeviceType t);  // throws if the device type has no backend built in
bool has_allocator(DeviceType t);
void register_allocator(DeviceType t, Allocator* a);

// A block of device memory shared by tensors that view it.
class Storage {
 public:
  Storage(size_t bytes, Device device);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
  Device device_;
};

}  // namespace myriad
