// Communication between training processes (docs/DISTRIBUTED.md). One small interface, three
// implementations: a single process (every collective is the identity), MPI and NCCL. MPI and
// NCCL live in plugins, libmyriad_mpi.so and libmyriad_nccl.so, loaded only when the process was
// started by an MPI launcher (mpirun sets OMPI_COMM_WORLD_SIZE / PMI_SIZE / PMIX_RANK), so
// single-process runs never need MPI, CUDA or NCCL at run time. Model code never sees this: the
// trainer applies parallelism from outside.
//
// Every collective is blocking and must be called by all ranks in the same order. Each call is
// counted under a name (bytes each rank sends in the bandwidth-optimal ring or pairwise
// algorithm, and wall seconds), so the trainer can log what moved against the planner's
// prediction. A watchdog aborts the whole job with a message naming the collective when one
// waits longer than the timeout (a rank that died or hangs), instead of hanging silently.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace myriad::dist {

struct CollectiveStats {
  int64_t calls = 0;
  double bytes = 0;    // sent by this rank
  double seconds = 0;  // wall time inside the collective
};

class Comm {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string backend() const = 0;  // "single", "mpi" or "nccl"

  // Sum of every rank's `data` (n values) into `data` on all ranks, added in rank order after an
  // all-gather, so every rank gets the same bits (decisions taken on it agree). For small
  // vectors: losses, norms, counts (exact below 2^53), histograms.
  void all_reduce_sum(const char* name, double* data, size_t n);
  // Integer sums are exact in any order: one all-reduce (ring: 2 (W-1)/W of the bytes sent).
  void all_reduce_sum(const char* name, int32_t* data, size_t n);
  // `send` holds sum(counts) floats, rank r's slice at offset sum(counts[0..r)); `recv`
  // (counts[rank] floats) gets the sum over ranks of this rank's slice.
  void reduce_scatter_sum(const char* name, const float* send, float* recv,
                          const std::vector<size_t>& counts);
  // Every rank contributes counts[rank] bytes; `recv` (sum(counts) bytes) gets them in rank order.
  void all_gather(const char* name, const void* send, void* recv,
                  const std::vector<size_t>& counts);
  // Rank r gets send_bytes[r] bytes from this rank (the send buffer holds them in rank order);
  // recv gets recv_bytes[q] bytes from each rank q, in rank order.
  void all_to_all(const char* name, const void* send, const std::vector<size_t>& send_bytes,
                  void* recv, const std::vector<size_t>& recv_bytes);
  void broadcast(const char* name, void* data, size_t bytes, int root);
  // Point to point (context parallel: a chunk's carried state to the next rank, its gradient
  // back): blocking; `bytes` must match on both sides.
  void send(const char* name, const void* data, size_t bytes, int dest);
  void recv(const char* name, void* data, size_t bytes, int src);
  void barrier(const char* name);
  // The ranks that pass the same color >= 0 form a new communicator, ordered by key then rank;
  // color < 0 gets null. A collective over this communicator.
  virtual std::unique_ptr<Comm> split(int color, int key) = 0;
  // Ends every rank of the job with exit code `code` after printing `why` (rank-prefixed).
  [[noreturn]] virtual void abort(int code, const std::string& why) = 0;

  // A collective waiting longer than this aborts the job (0: wait forever). Default 600 s, or
  // MYRIAD_COMM_TIMEOUT_S.
  void set_timeout(double seconds);
  const std::map<std::string, CollectiveStats>& stats() const { return stats_; }
  void reset_stats() { stats_.clear(); }

 protected:
  Comm();
  virtual void do_all_reduce_i32(int32_t* data, size_t n) = 0;
  virtual void do_reduce_scatter_f32(const float* send, float* recv,
                                     const std::vector<size_t>& counts) = 0;
  virtual void do_all_gather(const void* send, void* recv, const std::vector<size_t>& counts) = 0;
  virtual void do_all_to_all(const void* send, const std::vector<size_t>& send_bytes, void* recv,
                             const std::vector<size_t>& recv_bytes) = 0;
  virtual void do_broadcast(void* data, size_t bytes, int root) = 0;
  virtual void do_send(const void* data, size_t bytes, int dest) = 0;
  virtual void do_recv(void* data, size_t bytes, int src) = 0;
  virtual void do_barrier() = 0;

 private:
  struct Watch;
  template <class F>
  void timed(const char* name, double bytes, F&& f);
  std::map<std::string, CollectiveStats> stats_;
  std::shared_ptr<Watch> watch_;
};

// The process's communicator: MPI when started by an MPI launcher with more than one rank, else
// a single process; with MYRIAD_COMM=nccl, NCCL under any launcher (one GPU per rank, host
// buffers staged through the device). Errors (the plugin missing, MPI_Init failing) name the
// cause.
Comm& world();
// world() if it has been created with more than one rank, else null (for error paths that must
// not start MPI).
Comm* started_world();
// A single-process communicator (tests run a reference trainer beside the distributed one).
Comm& single();

}  // namespace myriad::dist
