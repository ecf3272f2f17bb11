#include "dist/comm.h"

#include <dlfcn.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <numeric>
#include <thread>

#include "core/error.h"

namespace myriad::dist {

namespace {
using Clock = std::chrono::steady_clock;

double env_timeout() {
  const char* s = std::getenv("MYRIAD_COMM_TIMEOUT_S");
  if (!s || !*s) return 600;
  char* end = nullptr;
  const double v = std::strtod(s, &end);
  MYRIAD_CHECK(end && *end == 0 && v >= 0, "MYRIAD_COMM_TIMEOUT_S: not a number of seconds: ", s);
  return v;
}
}  // namespace

// The watchdog: a thread that wakes every 100 ms while a collective is in flight and aborts the
// job once one has waited longer than the timeout.
struct Comm::Watch {
  std::mutex mu;
  std::condition_variable cv;
  std::thread thread;
  bool stop = false;
  const char* name = nullptr;  // the collective in flight, or null
  Clock::time_point since;
  double timeout = 600;

  ~Watch() {
    {
      std::lock_guard<std::mutex> lk(mu);
      stop = true;
    }
    cv.notify_all();
    if (thread.joinable()) thread.join();
  }
  void run(Comm* c) {
    std::unique_lock<std::mutex> lk(mu);
    while (!stop) {
      cv.wait_for(lk, std::chrono::milliseconds(100));
      if (stop || !name || timeout <= 0) continue;
      const double waited = std::chrono::duration<double>(Clock::now() - since).count();
      if (waited > timeout) {
        char why[256];
        std::snprintf(why, sizeof why,
                      "waited %.0f s in collective '%s' (timeout %.0f s): another rank died, "
                      "hangs or left the step; ending the job",
                      waited, name, timeout);
        lk.unlock();
        c->abort(3, why);
      }
    }
  }
};

Comm::Comm() : watch_(std::make_shared<Watch>()) {
  watch_->timeout = env_timeout();
}

void Comm::set_timeout(double seconds) {
  MYRIAD_CHECK(seconds >= 0, "comm: timeout must be >= 0 s, got ", seconds);
  std::lock_guard<std::mutex> lk(watch_->mu);
  watch_->timeout = seconds;
}

template <class F>
void Comm::timed(const char* name, double bytes, F&& f) {
  CollectiveStats& s = stats_[name];
  ++s.calls;
  s.bytes += bytes;
  if (size() == 1) {
    f();
    return;
  }
  {
    std::lock_guard<std::mutex> lk(watch_->mu);
    if (!watch_->thread.joinable()) watch_->thread = std::thread([this] { watch_->run(this); });
    watch_->name = name;
    watch_->since = Clock::now();
  }
  const auto t0 = Clock::now();
  f();
  s.seconds += std::chrono::duration<double>(Clock::now() - t0).count();
  std::lock_guard<std::mutex> lk(watch_->mu);
  watch_->name = nullptr;
}

void Comm::all_reduce_sum(const char* name, double* data, size_t n) {
  if (size() == 1) {
    ++stats_[name].calls;
    return;
  }
  const auto W = static_cast<size_t>(size());
  std::vector<double> all(n * W);
  all_gather(name, data, all.data(), std::vector<size_t>(W, n * sizeof(double)));
  for (size_t j = 0; j < n; ++j) {
    double t = 0;
    for (size_t r = 0; r < W; ++r) t += all[r * n + j];
    data[j] = t;
  }
}

void Comm::all_reduce_sum(const char* name, int32_t* data, size_t n) {
  const double W = size();
  timed(name, W > 1 ? 2 * (W - 1) / W * 4.0 * static_cast<double>(n) : 0.0,
        [&] { do_all_reduce_i32(data, n); });
}

void Comm::reduce_scatter_sum(const char* name, const float* send, float* recv,
                              const std::vector<size_t>& counts) {
  MYRIAD_CHECK(counts.size() == static_cast<size_t>(size()), "comm: reduce_scatter needs ", size(),
               " counts, got ", counts.size());
  const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
  const double others = 4.0 * static_cast<double>(total - counts[static_cast<size_t>(rank())]);
  timed(name, size() > 1 ? others : 0.0, [&] { do_reduce_scatter_f32(send, recv, counts); });
}

void Comm::all_gather(const char* name, const void* send, void* recv,
                      const std::vector<size_t>& counts) {
  MYRIAD_CHECK(counts.size() == static_cast<size_t>(size()), "comm: all_gather needs ", size(),
               " counts, got ", counts.size());
  const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
  const double others = static_cast<double>(total - counts[static_cast<size_t>(rank())]);
  timed(name, size() > 1 ? others : 0.0, [&] { do_all_gather(send, recv, counts); });
}

void Comm::all_to_all(const char* name, const void* send, const std::vector<size_t>& send_bytes,
                      void* recv, const std::vector<size_t>& recv_bytes) {
  MYRIAD_CHECK(send_bytes.size() == static_cast<size_t>(size()) &&
                   recv_bytes.size() == static_cast<size_t>(size()),
               "comm: all_to_all needs ", size(), " send and receive counts");
  const size_t total = std::accumulate(send_bytes.begin(), send_bytes.end(), size_t{0});
  const double others = static_cast<double>(total - send_bytes[static_cast<size_t>(rank())]);
  timed(name, others, [&] { do_all_to_all(send, send_bytes, recv, recv_bytes); });
}

void Comm::broadcast(const char* name, void* data, size_t bytes, int root) {
  MYRIAD_CHECK(root >= 0 && root < size(), "comm: broadcast root ", root, " out of range");
  timed(name, size() > 1 && rank() == root ? static_cast<double>(bytes) : 0.0,
        [&] { do_broadcast(data, bytes, root); });
}

void Comm::send(const char* name, const void* data, size_t bytes, int dest) {
  MYRIAD_CHECK(dest >= 0 && dest < size() && dest != rank(), "comm: send to rank ", dest,
               " from rank ", rank(), " of ", size());
  timed(name, static_cast<double>(bytes), [&] { do_send(data, bytes, dest); });
}

void Comm::recv(const char* name, void* data, size_t bytes, int src) {
  MYRIAD_CHECK(src >= 0 && src < size() && src != rank(), "comm: receive from rank ", src,
               " at rank ", rank(), " of ", size());
  timed(name, 0.0, [&] { do_recv(data, bytes, src); });
}

void Comm::barrier(const char* name) {
  timed(name, 0.0, [&] { do_barrier(); });
}

namespace {

class SingleComm final : public Comm {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string backend() const override { return "single"; }
  std::unique_ptr<Comm> split(int color, int) override {
    return color < 0 ? nullptr : std::make_unique<SingleComm>();
  }
  [[noreturn]] void abort(int code, const std::string& why) override {
    std::fprintf(stderr, "myriad: %s\n", why.c_str());
    std::fflush(stderr);
    std::_Exit(code);
  }

 protected:
  void do_all_reduce_i32(int32_t*, size_t) override {}
  void do_reduce_scatter_f32(const float* send, float* recv,
                             const std::vector<size_t>& counts) override {
    if (send != recv) std::memmove(recv, send, counts[0] * sizeof(float));
  }
  void do_all_gather(const void* send, void* recv, const std::vector<size_t>& counts) override {
    if (send != recv) std::memmove(recv, send, counts[0]);
  }
  void do_all_to_all(const void* send, const std::vector<size_t>& send_bytes, void* recv,
                     const std::vector<size_t>&) override {
    if (send != recv) std::memmove(recv, send, send_bytes[0]);
  }
  void do_broadcast(void*, size_t, int) override {}
  void do_send(const void*, size_t, int) override {}  // unreachable: send checks the rank
  void do_recv(void*, size_t, int) override {}
  void do_barrier() override {}
};

// The launcher's world size from its environment; 0 when not started by an MPI launcher.
int launched_size() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS"})
    if (const char* s = std::getenv(v); s && *s) return std::atoi(s);
  return 0;
}

std::string self_dir() {
  std::error_code ec;
  const auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string(".") : p.parent_path().string();
}

// Loads a communicator plugin, libmyriad_<kind>.so ("mpi" or "nccl"): MYRIAD_<KIND>_PLUGIN,
// else beside the executable, else its parent folder, else the build folder this binary came
// from; its factory is myriad_<kind>_create.
Comm* load_plugin(const std::string& kind) {
  std::string upper = kind;
  for (char& ch : upper) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  const std::string file = "libmyriad_" + kind + ".so";
  std::vector<std::string> tried;
  if (const char* p = std::getenv(("MYRIAD_" + upper + "_PLUGIN").c_str()); p && *p)
    tried.emplace_back(p);
  const std::string dir = self_dir();
  tried.push_back(dir + "/" + file);
  tried.push_back(dir + "/../" + file);
#ifdef MYRIAD_BUILD_DIR
  tried.push_back(std::string(MYRIAD_BUILD_DIR) + "/" + file);
#endif
  std::string errors;
  for (const std::string& path : tried) {
    if (!std::filesystem::exists(path)) continue;
    void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);  // MPI's own plugins need GLOBAL
    if (!h) {
      errors += std::string("\n  ") + dlerror();
      continue;
    }
    using Create = Comm* (*)();
    const std::string sym = "myriad_" + kind + "_create";
    auto create = reinterpret_cast<Create>(dlsym(h, sym.c_str()));
    MYRIAD_CHECK(create, "dist: ", path, " has no ", sym);
    return create();
  }
  std::string where;
  for (const auto& t : tried) where += "\n  " + t;
  throw Error(cat("dist: this process was started by an MPI launcher with ", launched_size(),
                  " ranks, but the ", kind, " plugin ", file, " could not be loaded (",
                  kind == "nccl"
                      ? "it is built with the CUDA toolkit's NCCL and libopenmpi-dev present"
                      : "build Myriad with libopenmpi-dev installed: scripts/install-deps.sh",
                  "). Looked in:", where, errors.empty() ? "" : "\nErrors:", errors));
}

// MYRIAD_COMM: "mpi" (the default) or "nccl".
std::string comm_kind() {
  const char* v = std::getenv("MYRIAD_COMM");
  const std::string k = v && *v ? v : "mpi";
  MYRIAD_CHECK(k == "mpi" || k == "nccl", "dist: MYRIAD_COMM=", k, " (expected mpi or nccl)");
  return k;
}
}  // namespace

Comm& single() {
  static SingleComm c;
  return c;
}

namespace {
std::atomic<Comm*> g_world{nullptr};
}

Comm& world() {
  static Comm* w = [] {
    // A launcher started more than one rank; NCCL also at one (a one-GPU machine's smoke test).
    const std::string kind = comm_kind();
    const int n = launched_size();
    const bool plugin = n > 1 || (kind == "nccl" && n == 1);
    Comm* c = plugin ? load_plugin(kind) : &single();  // lives until exit
    g_world = c;
    return c;
  }();
  return *w;
}

Comm* started_world() {
  Comm* c = g_world.load();
  return c && c->size() > 1 ? c : nullptr;
}

}  // namespace myriad::dist
