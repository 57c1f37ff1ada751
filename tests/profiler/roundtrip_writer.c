/* Writes a known ring with hz_profiler.h's own host-compiled store function, claiming
 * slots like the device does (one counter, every claim counted), then dumps the counter
 * and the ring to stdout as raw little-endian bytes: u64 claimed, then capacity records.
 * Usage: roundtrip_writer CAPACITY SPANS */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hz_profiler.h"

int main(int argc, char **argv) {
    if (argc != 3) return 2;
    const uint32_t capacity = (uint32_t)atoi(argv[1]);
    const int spans = atoi(argv[2]);
    uint64_t *ring = calloc((size_t)capacity * HZ_PROF_RECORD_WORDS + 1, sizeof(uint64_t));
    unsigned long long claimed = 0;
    hz_prof_t p = {ring, &claimed, capacity, 0};
    for (int i = 0; i < spans; ++i) {
        const uint32_t task = 1 + (uint32_t)(i % 3), block = (uint32_t)(i % 5);
        const uint64_t begin = 1000ull * (uint64_t)(i + 1) + block;
        const uint64_t end = begin + 100ull * task + (uint64_t)i;
        hz_prof_write(p, claimed++, task, 100u + block, block, begin, end, 0xA0000000ull + (uint64_t)i);
    }
    fwrite(&claimed, sizeof claimed, 1, stdout);
    fwrite(ring, sizeof(uint64_t), (size_t)capacity * HZ_PROF_RECORD_WORDS, stdout);
    free(ring);
    return 0;
}
