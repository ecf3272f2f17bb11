// Graceful stop for training: SIGINT/SIGTERM set a flag that the loop polls between steps (to
// save a checkpoint and exit). A second signal while a stop is already pending restores the
// default action and re-raises, so a stuck process still dies on a repeated Ctrl-C.
#pragma once
#include <csignal>

namespace myriad::train {

class StopSignal {
 public:
  // Installs the handlers (one StopSignal at a time) and clears the flag.
  StopSignal();
  // Restores the handlers that were installed before.
  ~StopSignal();
  StopSignal(const StopSignal&) = delete;
  StopSignal& operator=(const StopSignal&) = delete;

  bool requested() const;
  int signal_number() const;  // the signal that requested the stop, 0 if none
  void clear();               // e.g. after the stop was handled

 private:
  struct sigaction old_int_ {
  }, old_term_{};
};

}  // namespace myriad::train
