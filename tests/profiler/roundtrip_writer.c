/* Writes a known ring with hz_profiler.h's own host-compiled store function, claiming
 * slots like the device does (one counter, every claim counted), then dumps the counter
 * and the ring to stdout as raw little-endian bytes: u64 claimed, then capacity records.
 * Usage: roundtrip_writer CAPACITY SPANS [points [TASK_BASE]]: with `points` every span also leaves its
 * sub-spans (hz_prof_write_points): origin begin - 50, point 1 at begin, point 2 at begin + 10
 * (not reached in odd spans), claimed like the device does (the span and its sub-spans at once).
 * Span i's task is TASK_BASE + i % 3 (TASK_BASE 1 unless given). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hz_profiler.h"

int main(int argc, char **argv) {
    if (argc != 3 && !(argc >= 4 && argc <= 5 && strcmp(argv[3], "points") == 0)) return 2;
    const uint32_t capacity = (uint32_t)atoi(argv[1]);
    const int spans = atoi(argv[2]);
    const uint32_t task_base = argc == 5 ? (uint32_t)atoi(argv[4]) : 1u;
    uint64_t *ring = calloc((size_t)capacity * HZ_PROF_RECORD_WORDS + 1, sizeof(uint64_t));
    unsigned long long claimed = 0;
    hz_prof_t p = {ring, &claimed, capacity, 0};
    for (int i = 0; i < spans; ++i) {
        const uint32_t task = task_base + (uint32_t)(i % 3), block = (uint32_t)(i % 5);
        const uint64_t begin = 1000ull * (uint64_t)(i + 1) + block;
        const uint64_t end = begin + 100ull * task + (uint64_t)i;
        if (argc >= 4) {
            const uint64_t points[3] = {begin - 50u, begin, i % 2 ? 0u : begin + 10u};
            const unsigned long long slot = claimed;
            claimed += 1u + hz_prof_points_reached(points, 2);
            hz_prof_write_points(p, slot, task, 100u + block, block, begin, end, 0xA0000000ull + (uint64_t)i, points, 2);
            continue;
        }
        hz_prof_write(p, claimed++, task, 100u + block, block, begin, end, 0xA0000000ull + (uint64_t)i);
    }
    fwrite(&claimed, sizeof claimed, 1, stdout);
    fwrite(ring, sizeof(uint64_t), (size_t)capacity * HZ_PROF_RECORD_WORDS, stdout);
    free(ring);
    return 0;
}
