#include "train/signals.h"

#include <atomic>
#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace myriad::train {
namespace {

// Lock-free atomics are async-signal-safe.
std::atomic<int> g_signal{0};
std::atomic<bool> g_installed{false};
static_assert(std::atomic<int>::is_always_lock_free);

extern "C" void on_stop_signal(int sig) {
  int expected = 0;
  if (!g_signal.compare_exchange_strong(expected, sig)) {
    std::signal(sig, SIG_DFL);  // second signal: give up on a graceful stop
    std::raise(sig);
  }
}

}  // namespace

StopSignal::StopSignal() {
  MYRIAD_CHECK(!g_installed.exchange(true), "StopSignal: another StopSignal is already active");
  g_signal = 0;
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // let blocking I/O continue; the loop polls the flag
  bool int_ok = ::sigaction(SIGINT, &sa, &old_int_) == 0;
  if (!int_ok || ::sigaction(SIGTERM, &sa, &old_term_) != 0) {
    int err = errno;
    if (int_ok) ::sigaction(SIGINT, &old_int_, nullptr);
    g_installed = false;
    throw Error(cat("StopSignal: sigaction failed: ", std::strerror(err)));
  }
}

StopSignal::~StopSignal() {
  ::sigaction(SIGINT, &old_int_, nullptr);
  ::sigaction(SIGTERM, &old_term_, nullptr);
  g_installed = false;
}

bool StopSignal::requested() const {
  return g_signal.load() != 0;
}

int StopSignal::signal_number() const {
  return g_signal.load();
}

void StopSignal::clear() {
  g_signal = 0;
}

}  // namespace myriad::train
