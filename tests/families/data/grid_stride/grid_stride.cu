// Host-only check of hz::grid_stride_count (standalone/common/check.cuh) against the loop it
// counts, enumerated: ordering's litmus_check compares its outcome sums with it. Runs on a CPU.
#include <cstdio>

#include "../../../../standalone/common/check.cuh"

int main() {
  long checked = 0;
  for (unsigned threads : {1u, 32u, 96u, 256u})
    for (unsigned blocks : {1u, 2u, 3u, 7u, 132u})
      for (unsigned long long n : {0ull, 1ull, 31ull, 255ull, 256ull, 257ull, 1000ull, 33792ull, 33793ull, 100003ull}) {
        unsigned long long total = 0;
        for (unsigned b = 0; b < blocks; ++b) {
          unsigned long long visited = 0;
          for (unsigned t = 0; t < threads; ++t)
            for (unsigned long long i = (unsigned long long)b * threads + t; i < n; i += (unsigned long long)blocks * threads)
              ++visited;
          const unsigned long long got = hz::grid_stride_count(n, b, threads, blocks);
          if (got != visited) {
            std::printf("n=%llu block=%u threads=%u blocks=%u: %llu, the loop visits %llu\n", n, b, threads, blocks,
                        got, visited);
            return 1;
          }
          total += got;
          ++checked;
        }
        if (total != n) {
          std::printf("n=%llu threads=%u blocks=%u: the blocks' counts sum to %llu\n", n, threads, blocks, total);
          return 1;
        }
      }
  std::printf("ok %ld\n", checked);
  return 0;
}
