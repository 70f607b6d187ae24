#pragma once
// Rank 0 of a worker group (docs/serving.md §5.10): the engine of a supervised `dayzero serve`, run
// in its own process. It connects to the frontend's socket, loads the model, then takes the
// frontend's submit and cancel messages and sends back every request's outputs and a heartbeat
// (metrics, and how long the current step has run) four times a second. It returns when the
// frontend says shutdown or goes away.

#include <cstdint>
#include <string>
#include <vector>

#include "dayzero/core/status.h"
#include "dayzero/serve/server.h"

namespace dz::serve::worker {

// config.load_model loads this rank's model (a plan's other ranks follow it elsewhere).
// rank_pids: every rank's process id, which the frontend watches (a rank that dies is noticed at
// once, not when mpirun has torn the job down).
Status run_worker(const std::string& socket_path, ServerConfig config,
                  const std::vector<int64_t>& rank_pids);

}  // namespace dz::serve::worker
