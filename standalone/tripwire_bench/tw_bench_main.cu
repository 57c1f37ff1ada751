// tw_bench_main.cu -- times the tripwire benchmark kernel with the tripwire compiled in and
// writing (on), compiled in but given no file (on_null: base NULL, one branch per mark),
// and compiled out (off), in rotating order, one CUDA event pair per launch. Prints one
// JSON line per round and a final line with the checksum agreement.
//   usage: tw_bench [rounds] [layers] [phases] [work] [blocks_per_sm]
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "../include/hz_tripwire.h"
#include "../include/hz_tripwire_host.h"

extern "C" cudaError_t tw_bench_launch_on(int, unsigned*, float*, int, int, int, hz_tw_t, cudaStream_t);
extern "C" cudaError_t tw_bench_launch_off(int, unsigned*, float*, int, int, int, hz_tw_t, cudaStream_t);

#define CK(x)                                                                                  \
  do {                                                                                         \
    cudaError_t e_ = (x);                                                                      \
    if (e_ != cudaSuccess) {                                                                   \
      std::fprintf(stderr, "%s: %s (%s:%d)\n", #x, cudaGetErrorString(e_), __FILE__, __LINE__); \
      std::exit(3);                                                                            \
    }                                                                                          \
  } while (0)

int main(int argc, char** argv) {
  int rounds = argc > 1 ? std::atoi(argv[1]) : 31;
  int layers = argc > 2 ? std::atoi(argv[2]) : 300;
  int phases = argc > 3 ? std::atoi(argv[3]) : 8;
  int work = argc > 4 ? std::atoi(argv[4]) : 512;
  int per_sm = argc > 5 ? std::atoi(argv[5]) : 2;
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  const int grid = prop.multiProcessorCount * per_sm;
  unsigned* counter;
  float* out[3];
  CK(cudaMalloc(&counter, sizeof(unsigned)));
  for (auto& o : out) CK(cudaMalloc(&o, (size_t)grid * 256 * sizeof(float)));
  hz_tw_host tw;
  if (hz_tw_host_open(&tw, (uint32_t)grid) != 0) std::fprintf(stderr, "tripwire: %s\n", tw.error);
  std::fprintf(stderr, "tripwire mode %s%s%s\n", hz_tw_mode_name(tw.mode), tw.error[0] ? ": " : "", tw.error);
  hz_tw_t null_tw = {};
  cudaStream_t s;
  CK(cudaStreamCreate(&s));
  cudaEvent_t ev[2];
  CK(cudaEventCreate(&ev[0]));
  CK(cudaEventCreate(&ev[1]));
  // config 0 on (writing), 1 on_null, 2 off
  auto launch = [&](int cfg) -> float {
    CK(cudaEventRecord(ev[0], s));
    if (cfg == 0) CK(tw_bench_launch_on(grid, counter, out[0], layers, phases, work, hz_tw_host_launch(&tw), s));
    if (cfg == 1) CK(tw_bench_launch_on(grid, counter, out[1], layers, phases, work, null_tw, s));
    if (cfg == 2) CK(tw_bench_launch_off(grid, counter, out[2], layers, phases, work, null_tw, s));
    CK(cudaEventRecord(ev[1], s));
    CK(cudaEventSynchronize(ev[1]));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, ev[0], ev[1]));
    return ms;
  };
  for (int w = 0; w < 3; ++w) for (int c = 0; c < 3; ++c) launch(c);  // warm-up
  for (int r = 0; r < rounds; ++r) {
    float t[3];
    for (int k = 0; k < 3; ++k) {  // rotate the order so drift does not favour one config
      int c = (r + k) % 3;
      t[c] = launch(c);
    }
    std::printf("{\"round\":%d,\"on_ms\":%.5f,\"on_null_ms\":%.5f,\"off_ms\":%.5f}\n", r, t[0], t[1], t[2]);
  }
  std::vector<float> h[3];
  for (int c = 0; c < 3; ++c) {
    h[c].resize((size_t)grid * 256);
    CK(cudaMemcpy(h[c].data(), out[c], h[c].size() * sizeof(float), cudaMemcpyDeviceToHost));
  }
  bool same = h[0] == h[1] && h[1] == h[2];
  // breadcrumb stores per launch with the tripwire on: marks + barrier words + warp bytes
  long marks = (long)grid * (2 + (long)layers * phases);
  long warp_bytes = (long)grid * layers * 2 * 8;
  std::printf("{\"final\":true,\"grid\":%d,\"layers\":%d,\"phases\":%d,\"work\":%d,\"outputs_identical\":%s,"
              "\"mode\":\"%s\",\"marks_per_launch\":%ld,\"warp_byte_stores_per_launch\":%ld,"
              "\"generation\":%llu}\n",
              grid, layers, phases, work, same ? "true" : "false", hz_tw_mode_name(tw.mode), marks, warp_bytes,
              (unsigned long long)tw.arg.generation);
  hz_tw_host_close(&tw);
  return same ? 0 : 1;
}
