/* hz_profiler.h -- per-task begin/end stamps of a persistent kernel, into a device ring.
 *
 * Why: the faithful per-task gate (docs/gates.md) judges a candidate by the span of ITS task
 * inside the real megakernel at the production grid, not by a standalone benchmark: per task
 * id, slowCTA = the slowest single instance (end - begin), wall = max(end) - min(begin),
 * sumCTA = total busy block-time (the anti-sloughing guard). This header records the spans;
 * hazards.engine.profiler decodes them.
 *
 * Record (4 x u64, HZ_PROF_RECORD_WORDS): begin, end (globaltimer ns on NVIDIA; the
 * constant-rate s_memrealtime counter on AMD, 10 ns ticks on gfx9), where = task id (16) |
 * SM id (16, 0xFFFF unknown) | block (32), and one user word (aux). Tasks are matched by
 * their NUMERIC id; names are metadata the host keeps (the faithful per-task gate recipe's profiler wrote
 * UNKNOWN_<id> for names it lacked, so nothing here depends on a name).
 *
 * The ring has an explicit capacity. Every commit claims a slot from one 64-bit counter
 * (atomicAdd), so the counter ends at the number of spans the launch TRIED to record: a
 * counter above the capacity is overflow, reported by the decoder as dropped records --
 * never a silent truncation (the faithful per-task gate recipe's timing ring averaged only the first 8,117 of its
 * iterations and said nothing). The host zeroes the counter before each profiled launch.
 *
 * Use (the recording thread is the caller's choice, usually one per block):
 *
 *     __global__ void k(..., hz_prof_t prof) {
 *         HZ_PROF_BEGIN(span);                                   // uint64_t span = now
 *         ... the task's body ...
 *         if (threadIdx.x == 0) HZ_PROF_END(prof, TASK_ATTEND, span, aux);
 *         HZ_PROF_RESTAMP(span);                                 // reuse for the next task
 *     }
 *
 * Everything is compiled in only with -DHZ_PROFILER. Without it no clock is read and
 * nothing is stored: HZ_PROF_BEGIN declares a zero the compiler drops, HZ_PROF_END and
 * HZ_PROF_ONLY expand to nothing (tests/profiler checks the emitted PTX and AMDGCN). The
 * hz_prof_t type stays, so kernel signatures do not change. With it, a launch whose
 * records pointer is NULL costs one predicated-off branch per span.
 *
 * Cost: one clock read at begin, then per span one atomic and four 8-byte stores to
 * device memory by one thread (a few hundred ns, posted). Keep spans at task granularity
 * (microseconds), never per loop iteration.
 *
 * Sub-spans (optional): a task instance may also leave the time points inside it -- where
 * its wait ended, where a loop ended -- as records of their own, each from the previous
 * point (or the task's origin) to this one. A sub-span record is an ordinary record whose
 * task field is HZ_PROF_SUB_TASK(parent, point): bit 15 set, the point's index (7 bits),
 * the parent task id (8 bits, so a parent with sub-spans has an id below 256); aux is the
 * parent's. A sub-span those fields cannot name (parent id >= 256 or point index >= 128) is
 * never truncated into another task's: it is stored with point 0 (HZ_PROF_SUB_DROPPED; real
 * points count from 1), which the decoder counts as a dropped sub-span and says so
 * (Profile.subspans_dropped). hz_prof_commit_points claims the parent's record and its sub-spans with ONE
 * atomic, so sub-spans add stores, not round trips. The decoder keeps them apart
 * (Profile.subspans): the per-task metrics and everything judged from them never see them.
 *
 * The same header compiles as plain C/C++ on the host: the layout constants and
 * hz_prof_write are ordinary inline functions, so a host program writes the exact bytes
 * the device would (tests/profiler round-trip).
 */
#ifndef HZ_PROFILER_H
#define HZ_PROFILER_H

#include <stdint.h>

/* ---- layout (version 1); hazards/engine/profiler.py mirrors these ------------------- */
#define HZ_PROF_VERSION 1u
#define HZ_PROF_RECORD_WORDS 4u
#define HZ_PROF_W_BEGIN 0u
#define HZ_PROF_W_END 1u
#define HZ_PROF_W_WHERE 2u /* task:16 | sm:16 | block:32 */
#define HZ_PROF_W_AUX 3u
#define HZ_PROF_SM_UNKNOWN 0xFFFFu
#define HZ_PROF_SUB_FLAG 32768u /* 0x8000: task field of a sub-span record = flag | point:7 << 8 | parent:8 */
#define HZ_PROF_SUB_TASK(parent, point) (HZ_PROF_SUB_FLAG | (((uint32_t)(point) & 0x7Fu) << 8) | ((uint32_t)(parent) & 0xFFu))
/* The task field of a sub-span HZ_PROF_SUB_TASK cannot name (parent > 0xFF or point > 0x7F): point 0. */
#define HZ_PROF_SUB_DROPPED 32768u
#define HZ_PROF_SUB_FITS(parent, point) ((uint32_t)(parent) <= 0xFFu && (uint32_t)(point) <= 0x7Fu)

#if defined(__CUDACC__) || defined(__HIPCC__) || defined(__HIP__)
#define HZ_PROF_GPU 1
#define HZ_PROF_FN static __host__ __device__ __forceinline__
#else
#define HZ_PROF_FN static inline
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* The kernel argument. records == NULL disables recording for that launch. */
typedef struct hz_prof_t {
    uint64_t *records;           /* capacity * HZ_PROF_RECORD_WORDS words, device memory */
    unsigned long long *claimed; /* spans this launch tried to record (> capacity: dropped) */
    uint32_t capacity;           /* records the ring holds */
    uint32_t pad_;
} hz_prof_t;

HZ_PROF_FN uint64_t hz_prof_pack_where(uint32_t task, uint32_t sm, uint32_t block) {
    return ((uint64_t)(task & 0xFFFFu) << 48) | ((uint64_t)(sm & 0xFFFFu) << 32) | (uint64_t)block;
}

/* Store one record into slot `slot` if the ring has room; a slot past the capacity is
 * only counted (by whoever claimed it), never written. */
HZ_PROF_FN void hz_prof_write(hz_prof_t p, unsigned long long slot, uint32_t task, uint32_t sm,
                              uint32_t block, uint64_t begin, uint64_t end, uint64_t aux) {
    if (slot >= (unsigned long long)p.capacity) return;
    uint64_t *r = p.records + slot * HZ_PROF_RECORD_WORDS;
    r[HZ_PROF_W_BEGIN] = begin;
    r[HZ_PROF_W_END] = end;
    r[HZ_PROF_W_WHERE] = hz_prof_pack_where(task, sm, block);
    r[HZ_PROF_W_AUX] = aux;
}

/* Sub-spans: the records a span with points leaves (points[0] the origin, points[1..n] its
 * time points, 0 = not reached in this instance): one per reached point and one ending at the
 * span's end. */
HZ_PROF_FN uint32_t hz_prof_points_reached(const uint64_t *points, uint32_t n) {
    uint32_t reached = 1; /* the last sub-span always ends at the span's end */
    for (uint32_t k = 1; k <= n; ++k) reached += points[k] != 0;
    return reached;
}

/* Store the span at `slot` and its sub-spans after it: sub-span k (point k, or k = n + 1 for the
 * one ending at `end`) from the previous reached point, as HZ_PROF_SUB_TASK(task, k) with the
 * span's aux (HZ_PROF_SUB_DROPPED where those fields cannot hold task or k). Returns the slot
 * after the last record. */
HZ_PROF_FN unsigned long long hz_prof_write_points(hz_prof_t p, unsigned long long slot, uint32_t task, uint32_t sm,
                                                   uint32_t block, uint64_t begin, uint64_t end, uint64_t aux,
                                                   const uint64_t *points, uint32_t n) {
    hz_prof_write(p, slot++, task, sm, block, begin, end, aux);
    uint64_t prev = points[0];
    for (uint32_t k = 1; k <= n + 1; ++k) {
        uint64_t t = k <= n ? points[k] : end;
        if (t == 0) continue;
        if (t < prev) t = prev;
        hz_prof_write(p, slot++, HZ_PROF_SUB_FITS(task, k) ? HZ_PROF_SUB_TASK(task, k) : HZ_PROF_SUB_DROPPED, sm, block,
                      prev, t, aux);
        prev = t;
    }
    return slot;
}

#ifdef __cplusplus
}
#endif

/* ---- device side -------------------------------------------------------------------- */
#if defined(HZ_PROFILER) && defined(HZ_PROF_GPU)

#if defined(__HIPCC__) || defined(__HIP__)
static __device__ __forceinline__ uint64_t hz_prof_now(void) {
    return (uint64_t)__builtin_amdgcn_s_memrealtime(); /* constant rate, all CUs */
}
static __device__ __forceinline__ uint32_t hz_prof_smid(void) { return HZ_PROF_SM_UNKNOWN; }
static __device__ __forceinline__ unsigned long long hz_prof_claim(unsigned long long *c) {
    return __hip_atomic_fetch_add(c, 1ull, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
}
static __device__ __forceinline__ unsigned long long hz_prof_claim_n(unsigned long long *c, unsigned long long n) {
    return __hip_atomic_fetch_add(c, n, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
}
#else
static __device__ __forceinline__ uint64_t hz_prof_now(void) {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
static __device__ __forceinline__ uint32_t hz_prof_smid(void) {
    uint32_t s;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
    return s;
}
static __device__ __forceinline__ unsigned long long hz_prof_claim(unsigned long long *c) {
    return atomicAdd(c, 1ull);
}
static __device__ __forceinline__ unsigned long long hz_prof_claim_n(unsigned long long *c, unsigned long long n) {
    return atomicAdd(c, n);
}
#endif

/* End a span that began at `begin`: claim a slot, store the record (the calling thread). */
static __device__ __forceinline__ void hz_prof_commit(hz_prof_t p, uint32_t task, uint64_t begin, uint64_t aux) {
    if (p.records == 0) return;
    const uint64_t end = hz_prof_now();
    const unsigned long long slot = hz_prof_claim(p.claimed);
    hz_prof_write(p, slot, task, hz_prof_smid(), (uint32_t)blockIdx.x, begin, end, aux);
}

/* End a span that began at `begin` and the sub-spans inside it: points[0] is the origin,
 * points[1..n] the time points reached (0: not reached in this instance, skipped); sub-span
 * k ends at points[k] (k = 1..n) or, for k = n + 1, at this span's end, and begins at the
 * previous reached point. One claim for the span and every sub-span (the span first). */
static __device__ __forceinline__ void hz_prof_commit_points(hz_prof_t p, uint32_t task, uint64_t begin,
                                                             uint64_t aux, const uint64_t *points, uint32_t n) {
    if (p.records == 0) return;
    const uint64_t end = hz_prof_now();
    const unsigned long long slot = hz_prof_claim_n(p.claimed, 1ull + hz_prof_points_reached(points, n));
    hz_prof_write_points(p, slot, task, hz_prof_smid(), (uint32_t)blockIdx.x, begin, end, aux, points, n);
}

#define HZ_PROF_ENABLED 1
/* Declares `uint64_t span` holding the current time. */
#define HZ_PROF_BEGIN(span) uint64_t span = hz_prof_now()
/* Restart an existing span variable at the current time. */
#define HZ_PROF_RESTAMP(span) ((span) = hz_prof_now())
/* Record task `task` from `span` to now, with one user word; call from ONE thread. */
#define HZ_PROF_END(prof, task, span, aux) hz_prof_commit((prof), (uint32_t)(task), (span), (uint64_t)(aux))
/* A statement that exists only in profiled builds (plumbing a stamp through shared memory). */
#define HZ_PROF_ONLY(...) __VA_ARGS__

#else /* profiler compiled out: no clock read, no store. Arguments appear only under sizeof
   (unevaluated), so a typo still fails to compile. */
#define HZ_PROF_ENABLED 0
#define HZ_PROF_BEGIN(span) const uint64_t span = 0; (void)(span)
#define HZ_PROF_RESTAMP(span) ((void)(span))
#define HZ_PROF_END(prof, task, span, aux) \
    do { (void)sizeof(prof); (void)sizeof(task); (void)(span); (void)sizeof(aux); } while (0)
#define HZ_PROF_ONLY(...)
#endif

#endif /* HZ_PROFILER_H */
