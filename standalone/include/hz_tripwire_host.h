/* hz_tripwire_host.h -- one call to give a kernel its tripwire (host side, C API).
 *
 * The supervisor (stress/tripwire) creates a private file in /dev/shm and names it in
 * HZ_TRIPWIRE_PATH. A program calls hz_tw_host_open() once: it sizes the file for
 * `workers` slots, writes the header, mmaps it and cudaHostRegister(Mapped)s the mapping,
 * so the kernel's stores land directly in the file's pages (readable by another process
 * while the kernel hangs; still there after SIGKILL). Where registration is refused
 * (a disk filesystem, an old driver) it falls back to cudaHostAlloc(Mapped) plus a thread
 * that copies the buffer into the file every HZ_TRIPWIRE_SNAPSHOT_MS (default 100) ms.
 * The header records which mode ran. HZ_TRIPWIRE_MODE=snapshot forces the fallback.
 *
 *     hz_tw_host tw;
 *     if (hz_tw_host_open(&tw, n_blocks) != 0) fprintf(stderr, "%s\n", tw.error);
 *     kernel<<<n_blocks, 256>>>(..., hz_tw_host_launch(&tw));   // before every launch
 *     hz_tw_host_close(&tw);
 *
 * Without HZ_TRIPWIRE_PATH, open() succeeds with mode NONE and launch() returns a disabled
 * argument (base NULL), so instrumented binaries run unchanged outside the supervisor.
 * Implementation: standalone/tripwire_host/hz_tripwire_host.c (plain C; link -lpthread
 * and the CUDA or HIP runtime; -DHZ_TW_HOST_ONLY builds it with no GPU runtime at all).
 */
#ifndef HZ_TRIPWIRE_HOST_H
#define HZ_TRIPWIRE_HOST_H

#include <stddef.h>
#include <stdint.h>

#include "hz_tripwire.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct hz_tw_host {
    hz_tw_t arg;            /* what launch() hands to kernels */
    void *file_map;         /* the file's mapping (host view the supervisor also reads) */
    void *buffer;           /* what the device writes: file_map, or the cudaHostAlloc buffer */
    size_t bytes;           /* mapping size (page multiple) */
    uint32_t workers;
    uint32_t mode;          /* HZ_TW_MODE_* */
    int fd;
    int thread_running;
    unsigned snapshot_ms;
    volatile int stop_thread;
    void *thread_;          /* pthread_t, opaque here */
    char error[256];        /* why open() failed or fell back; "" otherwise */
} hz_tw_host;

/* Map HZ_TRIPWIRE_PATH (if set) with room for `workers` slots: exactly the workers the
 * kernel launches (a slot no worker writes reads as "block never resident"); re-open when
 * the launch shape changes. Launch one kernel at a time per tripwire (synchronise between
 * launches), so the header's generation names the launch that hangs. */
/* Map HZ_TRIPWIRE_PATH (if set) with room for `workers` slots. 0 on success (mode may be
 * NONE when the variable is unset), -1 on failure with a message in h->error; on failure
 * the program should run without the tripwire (launch() then returns a disabled arg). */
int hz_tw_host_open(hz_tw_host *h, uint32_t workers);

/* Bump the header's generation and return the kernel argument for the next launch. */
hz_tw_t hz_tw_host_launch(hz_tw_host *h);

/* Host view of worker `w`'s slot (for host-side writers and tests); NULL when disabled. */
volatile uint64_t *hz_tw_host_slot(hz_tw_host *h, uint32_t w);

/* Final snapshot (fallback mode), unregister, unmap, close. The file itself stays: the
 * supervisor that created it decides whether it is kept as an artifact. */
void hz_tw_host_close(hz_tw_host *h);

/* "registered", "snapshot", "host-only" or "none". */
const char *hz_tw_mode_name(uint32_t mode);

#ifdef __cplusplus
}
#endif

#endif /* HZ_TRIPWIRE_HOST_H */
