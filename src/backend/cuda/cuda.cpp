#include "backend/cuda/cuda.h"

#include <array>
#include <mutex>

#include "core/error.h"

namespace myriad::gpu {

void throw_cuda_error(const char* call, const char* file, int line, cudaError_t e) {
  cudaGetLastError();  // clear a non-sticky error so the process can go on after the throw
  throw Error(cat("CUDA error: ", call, " failed at ", file, ":", line, ": ", cudaGetErrorString(e),
                  " (", cudaGetErrorName(e), ")"));
}

void throw_cublas_error(const char* call, const char* file, int line, cublasStatus_t s) {
  throw Error(cat("cuBLAS error: ", call, " failed at ", file, ":", line, ": ",
                  cublasLtGetStatusString(s), " (", cublasLtGetStatusName(s), ")"));
}

int device_count() {
  static const int n = [] {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
      cudaGetLastError();
      return 0;
    }
    return count;
  }();
  return n;
}

DeviceGuard::DeviceGuard(int device) {
  CUDA_CHECK(cudaGetDevice(&prev_));
  if (prev_ != device) CUDA_CHECK(cudaSetDevice(device));
}
DeviceGuard::~DeviceGuard() {
  int cur = -1;
  if (cudaGetDevice(&cur) == cudaSuccess && cur != prev_) cudaSetDevice(prev_);
}

cudaStream_t current_stream(int device) {
  constexpr int kMaxDevices = 64;
  static std::array<cudaStream_t, kMaxDevices> streams{};
  static std::mutex mu;
  MYRIAD_CHECK(device >= 0 && device < device_count() && device < kMaxDevices, "cuda:", device,
               " is not a visible device (", device_count(), " visible)");
  std::lock_guard lock(mu);
  cudaStream_t& s = streams[device];
  if (!s) {
    DeviceGuard g(device);
    // Non-blocking: nothing else synchronises with the legacy default stream by accident.
    CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  }
  return s;
}

void synchronize(int device) {
  DeviceGuard g(device);
  CUDA_CHECK(cudaStreamSynchronize(current_stream(device)));
}

void copy_to_device_async(void* dst, const void* src, size_t bytes, int device) {
  if (!bytes) return;
  DeviceGuard g(device);
  CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, current_stream(device)));
}

void check_launch(const char* kernel, const char* file, int line) {
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw_cuda_error(cat("launch of ", kernel).c_str(), file, line, e);
}

}  // namespace myriad::gpu
