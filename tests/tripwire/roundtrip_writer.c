/* Writes a known pattern through hz_tripwire.h's own store functions (the host-compilable
 * path) into the file named by HZ_TRIPWIRE_PATH, for test_layout_roundtrip.py.
 * Pattern, for worker w of N (w from 0):
 *   generation 3 (three launches); worker N-1 never touched (a "never resident" block);
 *   w % 4 == 0: done; otherwise position (layer = w % 7, phase = 1 + w % 5, tile = w * 1000 + 7);
 *   w % 4 == 1: waiting at barrier 9, observed w, expected 100 + w, spins 2 * STRIDE;
 *   w % 4 == 2: passed barrier 12 (observed = expected = 55);
 *   aux[i] = 0x1111111111111111 * (i + 1) + w;
 *   warp k < 4 arrived at point 7; warps k < 3 exited at point 7 (mask 0xf vs 0x7).
 * A worker written in generation 2 is left behind in worker N-2 to check stale tags. */
#include <stdio.h>
#include <stdlib.h>

#include "hz_tripwire_host.h"

int main(int argc, char **argv) {
    uint32_t n = argc > 1 ? (uint32_t)atoi(argv[1]) : 8;
    hz_tw_host h;
    if (hz_tw_host_open(&h, n) != 0 || h.mode != HZ_TW_MODE_HOST_ONLY) {
        fprintf(stderr, "open failed: %s (mode %s)\n", h.error, hz_tw_mode_name(h.mode));
        return 2;
    }
    hz_tw_host_launch(&h);
    hz_tw_t old = hz_tw_host_launch(&h); /* generation 2 */
    hz_tw_ctx stale = hz_tw_open(old, n - 2);
    hz_tw_mark(&stale, 5, 3, 77);
    hz_tw_t tw = hz_tw_host_launch(&h); /* generation 3: the current launch */
    for (uint32_t w = 0; w + 2 < n; ++w) {
        hz_tw_ctx c = hz_tw_open(tw, w);
        hz_tw_mark(&c, 0, HZ_TW_PHASE_START, 0);
        for (uint32_t i = 0; i < HZ_TW_N_AUX; ++i) hz_tw_aux(&c, i, 0x1111111111111111ull * (i + 1) + w);
        for (uint32_t k = 0; k < 4; ++k) hz_tw_warp_point(&c, 0, k, 7);
        for (uint32_t k = 0; k < 3; ++k) hz_tw_warp_point(&c, 1, k, 7);
        if (w % 4 == 0) {
            hz_tw_mark(&c, 0, HZ_TW_PHASE_DONE, 0);
            continue;
        }
        hz_tw_mark(&c, w % 7, 1 + w % 5, w * 1000 + 7);
        if (w % 4 == 1) {
            for (uint32_t s = 0; s < 2 * HZ_TW_SPIN_STRIDE; ++s) hz_tw_poll(&c, 9, w, 100 + w);
        } else if (w % 4 == 2) {
            for (uint32_t s = 0; s < HZ_TW_SPIN_STRIDE; ++s) hz_tw_poll(&c, 12, 54, 55);
            hz_tw_passed(&c, 12, 55, 55);
        }
    }
    hz_tw_host_close(&h);
    return 0;
}
