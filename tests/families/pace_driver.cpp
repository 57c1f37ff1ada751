// Drives hz::pace_launch (standalone/common/pace.h) against a simulated GPU on the CPU, for
// tests/families/test_launch_pacing.py. Arguments: DEPTH LAUNCHES. The simulated GPU runs
// a stream's launches in order and only as far as the host waits for (the worst case: it
// never catches up on its own). Prints one JSON object: the launches each wait was for, the
// most launches ever queued, and whether a wait ever came for a slot not yet recorded or a
// launch already overwritten.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "../../standalone/common/pace.h"

struct FakeEvent {
  long launch = -1;  // the launch whose completion the slot marks; -1: never recorded
};

int main(int argc, char** argv) {
  if (argc != 3) return 2;
  const int depth = std::atoi(argv[1]);
  const long launches = std::atol(argv[2]);
  std::vector<FakeEvent> ring(depth);
  long enqueued = 0, completed = 0, max_queued = 0;
  bool bad_wait = false;
  std::string waits;
  for (long n = 0; n < launches; ++n) {
    ++enqueued;  // the family's kernels of launch n
    hz::pace_launch(
        ring.data(), depth, n,
        [&](FakeEvent& e) {  // cudaEventSynchronize: the GPU finishes up to e's launch
          if (e.launch < 0 || e.launch >= n) bad_wait = true;
          if (e.launch + 1 > completed) completed = e.launch + 1;
          waits += (waits.empty() ? "" : ",") + std::to_string(e.launch);
        },
        [&](FakeEvent& e) { e.launch = n; });  // cudaEventRecord after launch n's kernels
    if (enqueued - completed > max_queued) max_queued = enqueued - completed;
  }
  std::printf("{\"waits\":[%s],\"max_queued\":%ld,\"bad_wait\":%s}\n", waits.c_str(), max_queued,
              bad_wait ? "true" : "false");
  return 0;
}
