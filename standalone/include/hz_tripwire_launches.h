// hz_tripwire_launches.h -- the tripwire of a family binary that launches one kernel at a
// time with a worker count that may change from launch to launch (C++, host side; wraps
// the C API of hz_tripwire_host.h, whose implementation the including binary compiles in).
#pragma once

#include <cstdio>

#include "hz_tripwire_host.h"

// One slot per worker of the current launch shape: a slot nobody uses would read as a
// block that was never resident. So the mapping is re-opened (re-initialised) when the
// worker count changes, and each open says on stderr, prefixed by the program's name,
// which mode it runs in or why it failed (the program then runs without the tripwire).
class HzTripwireLaunches {
 public:
  explicit HzTripwireLaunches(const char* program) : program_(program) {}

  // The kernel argument for the next launch of `workers` workers.
  hz_tw_t launch(uint32_t workers) {
    if (!open_ || tw_.workers != workers) {
      if (open_) hz_tw_host_close(&tw_);
      if (hz_tw_host_open(&tw_, workers) != 0) std::fprintf(stderr, "%s: %s\n", program_, tw_.error);
      else if (tw_.mode != HZ_TW_MODE_NONE)
        std::fprintf(stderr, "%s: tripwire mode %s, %u slots%s%s\n", program_, hz_tw_mode_name(tw_.mode), workers,
                     tw_.error[0] ? ": " : "", tw_.error);
      open_ = true;
    }
    return hz_tw_host_launch(&tw_);
  }

  // The mode of the current mapping (HZ_TW_MODE_* by name), for the run's metrics.
  const char* mode_name() const { return hz_tw_mode_name(tw_.mode); }

 private:
  const char* program_;
  hz_tw_host tw_{};
  bool open_ = false;
};
