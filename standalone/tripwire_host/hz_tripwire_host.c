/* hz_tripwire_host.c -- implementation of hz_tripwire_host.h (plain C, no C++ needed).
 *
 * Build into any program:  nvcc ... standalone/tripwire_host/hz_tripwire_host.c -lpthread
 * or as a shared library:  make -C standalone/tripwire_host   (libhz_tripwire_host.so)
 * HIP:  compile with -D__HIP_PLATFORM_AMD__ and link amdhip64.
 * Tests: gcc -DHZ_TW_HOST_ONLY (no GPU runtime; mode "host-only").
 *
 * Why a file in /dev/shm and not just pinned memory: pinned memory dies with the process;
 * the file's pages survive SIGKILL and a crashed CUDA context, so the supervisor reads the
 * breadcrumbs after the fact. Why the fallback thread: cudaHostRegister refuses pages of a
 * disk filesystem (measured on the H200: "invalid argument" under /tmp); copying a
 * cudaHostAlloc buffer every 100 ms keeps the data at most that stale.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "../include/hz_tripwire_host.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#if defined(HZ_TW_HOST_ONLY)
/* no GPU runtime */
#elif defined(__HIP_PLATFORM_AMD__)
#include <hip/hip_runtime_api.h>
#define HZ_RT_OK hipSuccess
#define hz_rt_err_t hipError_t
#define hz_rt_register(p, n) hipHostRegister((p), (n), hipHostRegisterMapped)
#define hz_rt_unregister(p) hipHostUnregister(p)
#define hz_rt_dev_ptr(d, p) hipHostGetDevicePointer((d), (p), 0)
#define hz_rt_alloc_mapped(p, n) hipHostMalloc((p), (n), hipHostMallocMapped)
#define hz_rt_free_host(p) hipHostFree(p)
#define hz_rt_clear() ((void)hipGetLastError())
#define hz_rt_errstr(e) hipGetErrorString(e)
#else
#include <cuda_runtime_api.h>
#define HZ_RT_OK cudaSuccess
#define hz_rt_err_t cudaError_t
#define hz_rt_register(p, n) cudaHostRegister((p), (n), cudaHostRegisterMapped)
#define hz_rt_unregister(p) cudaHostUnregister(p)
#define hz_rt_dev_ptr(d, p) cudaHostGetDevicePointer((d), (p), 0)
#define hz_rt_alloc_mapped(p, n) cudaHostAlloc((p), (n), cudaHostAllocMapped)
#define hz_rt_free_host(p) cudaFreeHost(p)
#define hz_rt_clear() ((void)cudaGetLastError())
#define hz_rt_errstr(e) cudaGetErrorString(e)
#endif

static void put_u16(void *base, size_t off, uint16_t v) { memcpy((char *)base + off, &v, 2); }
static void put_u32(void *base, size_t off, uint32_t v) { memcpy((char *)base + off, &v, 4); }
static void put_u64(void *base, size_t off, uint64_t v) { memcpy((char *)base + off, &v, 8); }
static uint64_t get_u64(const void *base, size_t off) {
    uint64_t v;
    memcpy(&v, (const char *)base + off, 8);
    return v;
}

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

const char *hz_tw_mode_name(uint32_t mode) {
    switch (mode) {
    case HZ_TW_MODE_REGISTERED: return "registered";
    case HZ_TW_MODE_SNAPSHOT: return "snapshot";
    case HZ_TW_MODE_HOST_ONLY: return "host-only";
    default: return "none";
    }
}

static void write_header(void *base, uint32_t workers, uint32_t mode) {
    memset(base, 0, HZ_TW_HEADER_BYTES);
    put_u32(base, HZ_TW_H_MAGIC, HZ_TW_MAGIC);
    put_u16(base, HZ_TW_H_VERSION, (uint16_t)HZ_TW_VERSION);
    put_u16(base, HZ_TW_H_LAYOUT, (uint16_t)HZ_TW_LAYOUT);
    put_u32(base, HZ_TW_H_WORKERS, workers);
    put_u32(base, HZ_TW_H_SLOT_WORDS, HZ_TW_SLOT_WORDS);
    put_u32(base, HZ_TW_H_MODE, mode);
    put_u64(base, HZ_TW_H_PID, (uint64_t)getpid());
    put_u32(base, HZ_TW_H_SPIN_STRIDE, HZ_TW_SPIN_STRIDE);
    put_u32(base, HZ_TW_H_MAX_WARPS, HZ_TW_MAX_WARPS);
}

static void copy_to_file(hz_tw_host *h) {
    /* bump the counter in the source first so the copy carries it */
    uint64_t n = get_u64(h->buffer, HZ_TW_H_SNAPSHOTS) + 1;
    put_u64(h->buffer, HZ_TW_H_SNAPSHOTS, n);
    memcpy(h->file_map, h->buffer, h->bytes);
}

static void *snapshot_thread(void *arg) {
    hz_tw_host *h = (hz_tw_host *)arg;
    struct timespec ts = {(time_t)(h->snapshot_ms / 1000), (long)(h->snapshot_ms % 1000) * 1000000L};
    while (!h->stop_thread) {
        nanosleep(&ts, NULL);
        copy_to_file(h);
    }
    return NULL;
}

static void disable(hz_tw_host *h) {
    h->arg.base = NULL;
    h->arg.workers = 0;
}

int hz_tw_host_open(hz_tw_host *h, uint32_t workers) {
    memset(h, 0, sizeof(*h));
    h->fd = -1;
    h->workers = workers;
    h->mode = HZ_TW_MODE_NONE;
    const char *path = getenv("HZ_TRIPWIRE_PATH");
    if (!path || !*path) return 0;
    const char *ms = getenv("HZ_TRIPWIRE_SNAPSHOT_MS");
    h->snapshot_ms = (ms && atoi(ms) > 0) ? (unsigned)atoi(ms) : 100u;

    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t need = HZ_TW_HEADER_BYTES + (size_t)workers * HZ_TW_SLOT_WORDS * 8u;
    h->bytes = (need + page - 1) / page * page;

    h->fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (h->fd < 0) {
        snprintf(h->error, sizeof h->error, "tripwire: open %s: %s", path, strerror(errno));
        return -1;
    }
    /* truncate to 0 first: whatever an earlier process left is not this run's state */
    if (ftruncate(h->fd, 0) != 0 || ftruncate(h->fd, (off_t)h->bytes) != 0) {
        snprintf(h->error, sizeof h->error, "tripwire: size %s: %s", path, strerror(errno));
        close(h->fd);
        h->fd = -1;
        return -1;
    }
    h->file_map = mmap(NULL, h->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, h->fd, 0);
    if (h->file_map == MAP_FAILED) {
        snprintf(h->error, sizeof h->error, "tripwire: mmap %s: %s", path, strerror(errno));
        h->file_map = NULL;
        close(h->fd);
        h->fd = -1;
        return -1;
    }
    write_header(h->file_map, workers, HZ_TW_MODE_NONE);
    h->arg.workers = workers;

#if defined(HZ_TW_HOST_ONLY)
    h->buffer = h->file_map;
    h->mode = HZ_TW_MODE_HOST_ONLY;
    h->arg.base = (uint64_t *)h->file_map;
#else
    const char *force = getenv("HZ_TRIPWIRE_MODE");
    int want_snapshot = force && strcmp(force, "snapshot") == 0;
    void *dev = NULL;
    hz_rt_err_t e = HZ_RT_OK;
    if (!want_snapshot) {
        e = hz_rt_register(h->file_map, h->bytes);
        if (e == HZ_RT_OK) e = hz_rt_dev_ptr(&dev, h->file_map);
        if (e == HZ_RT_OK) {
            h->buffer = h->file_map;
            h->mode = HZ_TW_MODE_REGISTERED;
        } else {
            snprintf(h->error, sizeof h->error, "tripwire: host register refused (%s); using snapshot thread",
                     hz_rt_errstr(e));
            hz_rt_clear();
        }
    }
    if (h->mode == HZ_TW_MODE_NONE) {
        void *buf = NULL;
        e = hz_rt_alloc_mapped(&buf, h->bytes);
        if (e == HZ_RT_OK) e = hz_rt_dev_ptr(&dev, buf);
        if (e != HZ_RT_OK) {
            snprintf(h->error, sizeof h->error, "tripwire: mapped host alloc failed: %s", hz_rt_errstr(e));
            hz_rt_clear();
            if (buf) hz_rt_free_host(buf);
            disable(h);
            return -1;
        }
        memcpy(buf, h->file_map, h->bytes);
        h->buffer = buf;
        h->mode = HZ_TW_MODE_SNAPSHOT;
    }
    h->arg.base = (uint64_t *)dev;
#endif
    put_u32(h->buffer, HZ_TW_H_MODE, h->mode);
    if (h->buffer != h->file_map) put_u32(h->file_map, HZ_TW_H_MODE, h->mode);
    if (h->mode == HZ_TW_MODE_SNAPSHOT) {
        pthread_t *t = (pthread_t *)malloc(sizeof(pthread_t));
        if (t && pthread_create(t, NULL, snapshot_thread, h) == 0) {
            h->thread_ = t;
            h->thread_running = 1;
        } else {
            free(t);
            snprintf(h->error, sizeof h->error, "tripwire: could not start the snapshot thread");
        }
    }
    return 0;
}

hz_tw_t hz_tw_host_launch(hz_tw_host *h) {
    if (!h->buffer) {
        hz_tw_t off;
        memset(&off, 0, sizeof off);
        return off;
    }
    uint64_t gen = get_u64(h->buffer, HZ_TW_H_GENERATION) + 1;
    put_u64(h->buffer, HZ_TW_H_LAUNCH_NS, now_ns());
    put_u64(h->buffer, HZ_TW_H_GENERATION, gen);
    if (h->buffer != h->file_map) { /* keep the file's header current between copies */
        put_u64(h->file_map, HZ_TW_H_LAUNCH_NS, get_u64(h->buffer, HZ_TW_H_LAUNCH_NS));
        put_u64(h->file_map, HZ_TW_H_GENERATION, gen);
    }
    h->arg.generation = gen;
    return h->arg;
}

volatile uint64_t *hz_tw_host_slot(hz_tw_host *h, uint32_t w) {
    if (!h->buffer || w >= h->workers) return NULL;
    return (volatile uint64_t *)h->buffer + HZ_TW_HEADER_WORDS + (size_t)w * HZ_TW_SLOT_WORDS;
}

void hz_tw_host_close(hz_tw_host *h) {
    if (h->thread_running) {
        h->stop_thread = 1;
        pthread_join(*(pthread_t *)h->thread_, NULL);
        free(h->thread_);
        h->thread_ = NULL;
        h->thread_running = 0;
        copy_to_file(h);
    }
#if !defined(HZ_TW_HOST_ONLY)
    if (h->mode == HZ_TW_MODE_REGISTERED) {
        if (hz_rt_unregister(h->file_map) != HZ_RT_OK) hz_rt_clear(); /* sticky error after a fault */
    } else if (h->mode == HZ_TW_MODE_SNAPSHOT && h->buffer) {
        if (hz_rt_free_host(h->buffer) != HZ_RT_OK) hz_rt_clear();
    }
#endif
    if (h->file_map) munmap(h->file_map, h->bytes);
    if (h->fd >= 0) close(h->fd);
    h->file_map = NULL;
    h->buffer = NULL;
    h->fd = -1;
    disable(h);
}
