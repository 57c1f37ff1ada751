/* A host program that behaves like an instrumented persistent kernel, for the end-to-end
 * tests of the collector and the post-mortem path (no GPU: hz_tripwire_host built with
 * -DHZ_TW_HOST_ONLY). Argument: clean | hang | fault | noopen. Worker count: argv[2] (8).
 *   hang:  workers 0..n-3 wait at barrier 3 (observed 5, expected 6), polling forever
 *          (their spin counts advance); worker n-2 is a straggler frozen at phase 7
 *          layer 4; worker n-1 never starts.
 *   fault: the same breadcrumbs, then abort() (SIGABRT).
 *   clean: every worker marks DONE; exit 0.
 *   noopen: never opens the tripwire, then hangs (the "never opened" sentinel). */
#define _DEFAULT_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hz_tripwire_host.h"

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "clean";
    uint32_t n = argc > 2 ? (uint32_t)atoi(argv[2]) : 8;
    if (strcmp(mode, "noopen") == 0) {
        for (;;) pause();
    }
    hz_tw_host h;
    if (hz_tw_host_open(&h, n) != 0) {
        fprintf(stderr, "%s\n", h.error);
        return 2;
    }
    hz_tw_t tw = hz_tw_host_launch(&h);
    hz_tw_ctx c[64];
    for (uint32_t w = 0; w < n && w < 64; ++w) c[w] = hz_tw_open(tw, w);
    if (strcmp(mode, "clean") == 0) {
        for (uint32_t w = 0; w < n; ++w) hz_tw_mark(&c[w], 0, HZ_TW_PHASE_DONE, 0);
        printf("HZ_RESULT {\"status\": \"ok\", \"launches\": 1, \"mismatched\": 0}\n");
        hz_tw_host_close(&h);
        return 0;
    }
    for (uint32_t w = 0; w + 2 < n; ++w) hz_tw_mark(&c[w], 5, 6, w);
    hz_tw_mark(&c[n - 2], 4, 7, 0);
    for (uint32_t w = 0; w + 2 < n; ++w)
        for (uint32_t s = 0; s < HZ_TW_SPIN_STRIDE; ++s) hz_tw_poll(&c[w], 3, 5, 6);
    if (strcmp(mode, "fault") == 0) {
        fprintf(stderr, "an illegal memory access was encountered\n");
        abort();
    }
    printf("waiting forever\n");
    fflush(stdout);
    for (;;) {
        for (uint32_t w = 0; w + 2 < n; ++w) hz_tw_poll(&c[w], 3, 5, 6);
        usleep(100);
    }
}
