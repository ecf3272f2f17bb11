// The MPI communicator, built as the plugin libmyriad_mpi.so (dist/comm.h explains why a plugin).
// It links MPI and nothing of Myriad's but the Comm interface. MPI_Init runs when the plugin is
// created and MPI_Finalize at exit. Broadcasts above 256 MiB go in pieces; the vector collectives
// take up to 2^31 - 1 elements per rank.
#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "dist/comm.h"
#include "dist/mpi/mpi_init.h"

namespace myriad::dist {
namespace {

void check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw std::runtime_error(std::string("MPI ") + what + ": " + std::string(msg, len));
}

constexpr size_t kPiece = static_cast<size_t>(INT_MAX) / 8;

class MpiComm final : public Comm {
 public:
  MpiComm() {
    init_mpi_once();
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  explicit MpiComm(MPI_Comm c) : comm_(c) {
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  ~MpiComm() override {
    int fin = 0;
    MPI_Finalized(&fin);
    if (comm_ != MPI_COMM_WORLD && !fin) MPI_Comm_free(&comm_);
  }
  std::unique_ptr<Comm> split(int color, int key) override {
    MPI_Comm c = MPI_COMM_NULL;
    check(MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &c), "Comm_split");
    if (c == MPI_COMM_NULL) return nullptr;
    return std::make_unique<MpiComm>(c);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "mpi"; }
  [[noreturn]] void abort(int code, const std::string& why) override {
    std::fprintf(stderr, "myriad: rank %d of %d: %s\n", rank_, size_, why.c_str());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);
  }

 protected:
  void do_all_reduce_i32(int32_t* data, size_t n) override {
    for (size_t i = 0; i < n; i += kPiece)
      check(MPI_Allreduce(MPI_IN_PLACE, data + i, static_cast<int>(std::min(kPiece, n - i)),
                          MPI_INT32_T, MPI_SUM, comm_),
            "Allreduce");
  }
  void do_reduce_scatter_f32(const float* send, float* recv,
                             const std::vector<size_t>& counts) override {
    std::vector<int> c(counts.size());
    for (size_t r = 0; r < counts.size(); ++r) c[r] = to_int(counts[r]);
    check(MPI_Reduce_scatter(send, recv, c.data(), MPI_FLOAT, MPI_SUM, comm_), "Reduce_scatter");
  }
  void do_all_gather(const void* send, void* recv, const std::vector<size_t>& counts) override {
    std::vector<int> c(counts.size()), displ(counts.size());
    size_t off = 0;
    for (size_t r = 0; r < counts.size(); ++r) {
      c[r] = to_int(counts[r]);
      displ[r] = to_int(off);
      off += counts[r];
    }
    check(MPI_Allgatherv(send, c[static_cast<size_t>(rank_)], MPI_BYTE, recv, c.data(),
                         displ.data(), MPI_BYTE, comm_),
          "Allgatherv");
  }
  void do_all_to_all(const void* send, const std::vector<size_t>& send_bytes, void* recv,
                     const std::vector<size_t>& recv_bytes) override {
    std::vector<int> sc(send_bytes.size()), sd(send_bytes.size()), rc(recv_bytes.size()),
        rd(recv_bytes.size());
    size_t so = 0, ro = 0;
    for (size_t r = 0; r < send_bytes.size(); ++r) {
      sc[r] = to_int(send_bytes[r]), sd[r] = to_int(so), so += send_bytes[r];
      rc[r] = to_int(recv_bytes[r]), rd[r] = to_int(ro), ro += recv_bytes[r];
    }
    check(MPI_Alltoallv(send, sc.data(), sd.data(), MPI_BYTE, recv, rc.data(), rd.data(), MPI_BYTE,
                        comm_),
          "Alltoallv");
  }
  void do_broadcast(void* data, size_t bytes, int root) override {
    auto* p = static_cast<char*>(data);
    for (size_t i = 0; i < bytes; i += kPiece)
      check(MPI_Bcast(p + i, static_cast<int>(std::min(kPiece, bytes - i)), MPI_BYTE, root, comm_),
            "Bcast");
  }
  void do_send(const void* data, size_t bytes, int dest) override {
    const auto* p = static_cast<const char*>(data);
    for (size_t i = 0; i < bytes || i == 0; i += kPiece) {
      check(
          MPI_Send(p + i, static_cast<int>(std::min(kPiece, bytes - i)), MPI_BYTE, dest, 0, comm_),
          "Send");
      if (bytes == 0) break;
    }
  }
  void do_recv(void* data, size_t bytes, int src) override {
    auto* p = static_cast<char*>(data);
    for (size_t i = 0; i < bytes || i == 0; i += kPiece) {
      check(MPI_Recv(p + i, static_cast<int>(std::min(kPiece, bytes - i)), MPI_BYTE, src, 0, comm_,
                     MPI_STATUS_IGNORE),
            "Recv");
      if (bytes == 0) break;
    }
  }
  void do_barrier() override { check(MPI_Barrier(comm_), "Barrier"); }

 private:
  static int to_int(size_t n) {
    if (n > static_cast<size_t>(INT_MAX))
      throw std::runtime_error("MPI: a vector collective of more than 2^31 elements per rank");
    return static_cast<int>(n);
  }
  MPI_Comm comm_ = MPI_COMM_WORLD;
  int rank_ = 0, size_ = 1;
};

}  // namespace
}  // namespace myriad::dist

extern "C" __attribute__((visibility("default"))) myriad::dist::Comm* myriad_mpi_create() {
  return new myriad::dist::MpiComm();
}
