// MPI start-up shared by the communicator plugins that MPI launches (libmyriad_mpi.so and
// libmyriad_nccl.so): MPI_Init once per process, MPI_Finalize at exit.
#pragma once
#include <mpi.h>

#include <cstdlib>
#include <stdexcept>

namespace myriad::dist {

inline void init_mpi_once() {
  int inited = 0;
  MPI_Initialized(&inited);
  if (inited) return;
  int provided = 0;
  if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
    throw std::runtime_error("MPI_Init_thread failed");
  std::atexit([] {
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin) MPI_Finalize();
  });
}

}  // namespace myriad::dist
