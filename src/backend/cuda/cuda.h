// Shared helpers of the CUDA backend: error checks that throw myriad::Error, the device guard,
// and the per-device stream every kernel, copy and GEMM of the backend runs on.
#pragma once
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/dtype.h"

namespace myriad::gpu {

[[noreturn]] void throw_cuda_error(const char* call, const char* file, int line, cudaError_t e);
[[noreturn]] void throw_cublas_error(const char* call, const char* file, int line,
                                     cublasStatus_t s);

// Number of visible devices; 0 (never an error, nothing printed) without a driver or a GPU.
int device_count();

// Makes `device` current for the scope and restores the previous one.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = -1;
};

// The backend's stream on `device`, created on first use. Everything in the backend is ordered
// on it, so the caching allocator can reuse a freed block at once.
cudaStream_t current_stream(int device);
// Waits for the device's stream.
void synchronize(int device);
// Queues a copy of host bytes (ordinary pageable memory: small tables a kernel reads) to dst on
// the device's stream, without waiting for the device: CUDA stages pageable memory before the
// call returns, so src may go at once; the kernels queued after the copy see the bytes.
void copy_to_device_async(void* dst, const void* src, size_t bytes, int device);
// Raises the error of the last kernel launch, naming the kernel (use CUDA_CHECK_LAUNCH).
void check_launch(const char* kernel, const char* file, int line);

// C[b] = beta * C[b] over a strided batch of rows x cols matrices (GEMMs with k = 0). beta = 0
// writes zeros whatever C held.
void scale_matrices(void* c, DType t, int64_t batch, int64_t rows, int64_t cols, int64_t ld,
                    int64_t stride, float beta, int device);

}  // namespace myriad::gpu

#define CUDA_CHECK(call)                                                       \
  do {                                                                         \
    cudaError_t myriad_err_ = (call);                                          \
    if (myriad_err_ != cudaSuccess) [[unlikely]]                               \
      ::myriad::gpu::throw_cuda_error(#call, __FILE__, __LINE__, myriad_err_); \
  } while (0)

#define CUBLAS_CHECK(call)                                                      \
  do {                                                                          \
    cublasStatus_t myriad_st_ = (call);                                         \
    if (myriad_st_ != CUBLAS_STATUS_SUCCESS) [[unlikely]]                       \
      ::myriad::gpu::throw_cublas_error(#call, __FILE__, __LINE__, myriad_st_); \
  } while (0)

#define CUDA_CHECK_LAUNCH(kernel) ::myriad::gpu::check_launch(kernel, __FILE__, __LINE__)
