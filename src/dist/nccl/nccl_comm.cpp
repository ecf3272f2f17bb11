// The NCCL communicator, built as the plugin libmyriad_nccl.so when the CUDA toolkit with NCCL
// and MPI are present (docs/DISTRIBUTED.md). MPI launches the ranks and carries NCCL's unique id
// from rank 0 to the others; every collective then runs on NCCL, on the GPU of the rank's local
// index (OMPI_COMM_WORLD_LOCAL_RANK modulo the visible devices). One rank per GPU: NCCL refuses
// two ranks on one device. Selected with MYRIAD_COMM=nccl under mpirun (also at one rank, as a
// smoke test on a one-GPU machine).
//
// The Comm interface passes host or device pointers. Device memory goes to NCCL as it is; host
// buffers are staged through a device scratch buffer (the trainer's optimizer state is on the
// host today). Every call ends with the stream synchronised: blocking, as the interface says.
// NCCL wants equal counts per rank for reduce-scatter and all-gather, so uneven vectors are
// padded to the largest rank's count.
#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "dist/comm.h"
#include "dist/mpi/mpi_init.h"

namespace myriad::dist {
namespace {

void check(ncclResult_t rc, const char* what) {
  if (rc == ncclSuccess) return;
  throw std::runtime_error(std::string("NCCL ") + what + ": " + ncclGetErrorString(rc));
}
void check(cudaError_t rc, const char* what) {
  if (rc == cudaSuccess) return;
  throw std::runtime_error(std::string("CUDA ") + what + ": " + cudaGetErrorString(rc));
}
void check_mpi(int rc, const char* what) {
  if (rc != MPI_SUCCESS) throw std::runtime_error(std::string("MPI ") + what + " failed");
}

bool on_device(const void* p) {
  if (!p) return false;
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError();  // a plain host pointer on older runtimes
    return false;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

// A grow-only device buffer.
class Scratch {
 public:
  ~Scratch() {
    if (p_) cudaFree(p_);
  }
  char* get(size_t bytes) {
    if (bytes > cap_) {
      if (p_) check(cudaFree(p_), "cudaFree");
      p_ = nullptr;
      check(cudaMalloc(&p_, std::max<size_t>(bytes, 1)), "cudaMalloc");
      cap_ = bytes;
    }
    return static_cast<char*>(p_);
  }

 private:
  void* p_ = nullptr;
  size_t cap_ = 0;
};

class NcclComm final : public Comm {
 public:
  NcclComm() {
    init_mpi_once();
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    int devices = 0;
    check(cudaGetDeviceCount(&devices), "cudaGetDeviceCount");
    if (devices < 1) throw std::runtime_error("NCCL: no CUDA device visible to this rank");
    const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");
    device_ = (local ? std::atoi(local) : rank_) % devices;
    check(cudaSetDevice(device_), "cudaSetDevice");
    ncclUniqueId id{};
    if (rank_ == 0) check(ncclGetUniqueId(&id), "GetUniqueId");
    check_mpi(MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD), "Bcast of the NCCL id");
    check(ncclCommInitRank(&comm_, size_, id, rank_), "CommInitRank");
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  }
  NcclComm(ncclComm_t c, int device) : comm_(c), device_(device) {
    check(ncclCommUserRank(comm_, &rank_), "CommUserRank");
    check(ncclCommCount(comm_, &size_), "CommCount");
    check(cudaSetDevice(device_), "cudaSetDevice");
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  }
  ~NcclComm() override {
    if (stream_) cudaStreamDestroy(stream_);
    if (comm_) ncclCommDestroy(comm_);
  }
  std::unique_ptr<Comm> split(int color, int key) override {
    ncclComm_t c = nullptr;
    check(ncclCommSplit(comm_, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &c, nullptr),
          "CommSplit");
    if (!c) return nullptr;
    return std::make_unique<NcclComm>(c, device_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "nccl"; }
  [[noreturn]] void abort(int code, const std::string& why) override {
    std::fprintf(stderr, "myriad: rank %d of %d: %s\n", rank_, size_, why.c_str());
    std::fflush(stderr);
    if (comm_) ncclCommAbort(comm_);
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);
  }

 protected:
  void do_all_reduce_i32(int32_t* data, size_t n) override {
    const size_t bytes = n * sizeof(int32_t);
    char* d = in(data, bytes, a_);
    check(ncclAllReduce(d, d, n, ncclInt32, ncclSum, comm_, stream_), "AllReduce");
    out(data, d, bytes);
  }
  void do_reduce_scatter_f32(const float* send, float* recv,
                             const std::vector<size_t>& counts) override {
    const size_t m = *std::max_element(counts.begin(), counts.end());
    const auto W = static_cast<size_t>(size_);
    // Rank r's slice at r * m, zero-padded to m values.
    float* d = reinterpret_cast<float*>(a_.get(W * m * sizeof(float) + m * sizeof(float)));
    float* r = d + W * m;
    check(cudaMemsetAsync(d, 0, W * m * sizeof(float), stream_), "cudaMemset");
    const cudaMemcpyKind kind = on_device(send) ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice;
    size_t off = 0;
    for (size_t q = 0; q < W; ++q) {
      check(cudaMemcpyAsync(d + q * m, send + off, counts[q] * sizeof(float), kind, stream_),
            "cudaMemcpy");
      off += counts[q];
    }
    check(ncclReduceScatter(d, r, m, ncclFloat32, ncclSum, comm_, stream_), "ReduceScatter");
    out(recv, reinterpret_cast<char*>(r), counts[static_cast<size_t>(rank_)] * sizeof(float));
  }
  void do_all_gather(const void* send, void* recv, const std::vector<size_t>& counts) override {
    const size_t m = *std::max_element(counts.begin(), counts.end());
    const auto W = static_cast<size_t>(size_);
    char* d = a_.get(m + W * m);
    char* g = d + m;
    copy(d, send, counts[static_cast<size_t>(rank_)]);
    check(ncclAllGather(d, g, m, ncclUint8, comm_, stream_), "AllGather");
    const cudaMemcpyKind kind = on_device(recv) ? cudaMemcpyDeviceToDevice : cudaMemcpyDeviceToHost;
    size_t off = 0;
    for (size_t q = 0; q < W; ++q) {
      check(cudaMemcpyAsync(static_cast<char*>(recv) + off, g + q * m, counts[q], kind, stream_),
            "cudaMemcpy");
      off += counts[q];
    }
    sync();
  }
  void do_all_to_all(const void* send, const std::vector<size_t>& send_bytes, void* recv,
                     const std::vector<size_t>& recv_bytes) override {
    size_t st = 0, rt = 0;
    for (size_t b : send_bytes) st += b;
    for (size_t b : recv_bytes) rt += b;
    char* s = in(send, st, a_);
    char* r = on_device(recv) ? static_cast<char*>(recv) : b_.get(rt);
    check(ncclGroupStart(), "GroupStart");
    size_t so = 0, ro = 0;
    for (int q = 0; q < size_; ++q) {
      const auto uq = static_cast<size_t>(q);
      if (send_bytes[uq])
        check(ncclSend(s + so, send_bytes[uq], ncclUint8, q, comm_, stream_), "Send");
      if (recv_bytes[uq])
        check(ncclRecv(r + ro, recv_bytes[uq], ncclUint8, q, comm_, stream_), "Recv");
      so += send_bytes[uq], ro += recv_bytes[uq];
    }
    check(ncclGroupEnd(), "GroupEnd");
    if (r != recv) {
      out(recv, r, rt);
    } else {
      sync();
    }
  }
  void do_broadcast(void* data, size_t bytes, int root) override {
    char* d = in(data, bytes, a_);
    check(ncclBroadcast(d, d, bytes, ncclUint8, root, comm_, stream_), "Broadcast");
    out(data, d, bytes);
  }
  void do_send(const void* data, size_t bytes, int dest) override {
    char* d = in(data, bytes, a_);
    check(ncclSend(d, bytes, ncclUint8, dest, comm_, stream_), "Send");
    sync();
  }
  void do_recv(void* data, size_t bytes, int src) override {
    char* d = on_device(data) ? static_cast<char*>(data) : a_.get(bytes);
    check(ncclRecv(d, bytes, ncclUint8, src, comm_, stream_), "Recv");
    out(data, d, bytes);
  }
  void do_barrier() override {
    int32_t one = 1;
    do_all_reduce_i32(&one, 1);
  }

 private:
  void sync() { check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"); }
  // dst (device) <- src (host or device), `bytes` of them, on the stream.
  void copy(char* dst, const void* src, size_t bytes) {
    if (bytes == 0) return;
    check(cudaMemcpyAsync(dst, src, bytes,
                          on_device(src) ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice,
                          stream_),
          "cudaMemcpy");
  }
  // A device pointer with p's bytes: p itself on the device, else a staged copy in s.
  char* in(const void* p, size_t bytes, Scratch& s) {
    if (on_device(p)) return static_cast<char*>(const_cast<void*>(p));
    char* d = s.get(bytes);
    copy(d, p, bytes);
    return d;
  }
  // Back to p (when it is host memory) and wait.
  void out(void* p, const char* d, size_t bytes) {
    if (p != d && bytes)
      check(cudaMemcpyAsync(p, d, bytes,
                            on_device(p) ? cudaMemcpyDeviceToDevice : cudaMemcpyDeviceToHost,
                            stream_),
            "cudaMemcpy");
    sync();
  }

  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  int device_ = 0, rank_ = 0, size_ = 1;
  Scratch a_, b_;
};

}  // namespace
}  // namespace myriad::dist

extern "C" __attribute__((visibility("default"))) myriad::dist::Comm* myriad_nccl_create() {
  return new myriad::dist::NcclComm();
}
