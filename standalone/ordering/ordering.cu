// Family `ordering`: memory ordering across blocks.
//
// (a) Litmus tests MP, SB, LB, CoRR between threads of different blocks, many instances per
//     launch, with the incantations of the GPU litmus literature (Alglave et al. 2015;
//     Sorensen et al.): memory stress by extra blocks on a disjoint scratch region,
//     pre-stress by the testing threads, block/thread id randomisation, a spin barrier
//     before the test, location stride and permutation. Every instance's outcome is
//     classified on the device; the relaxed ("weak") outcome counts as a bad element.
// (b) `pc`: a persistent producer/consumer loop reusing one buffer per pair. The seeded
//     hazards: a consumer that spins on the flag with plain volatile loads and then reads the
//     data with ordinary (L1-cached) loads, without acquire, sees the previous iteration's
//     lines; a producer that publishes the flag without a release fence may publish before
//     its data stores are visible.
// Why the fixed variants are correct: a release (fence.sc / st.release at gpu scope) after
// the writer's data and an acquire (fence.sc / ld.acquire at gpu scope) after the reader's
// flag read form a synchronizes-with edge in the PTX memory model, so the reader observes
// the data (MP, pc); SB needs a full fence on both sides; LB needs the store of each side
// ordered after its load; CoRR is guaranteed by coherence alone.
#include "../common/harness.h"

namespace {

enum Test { MP = 0, SB = 1, LB = 2, CORR = 3, PC = 4 };
enum Sync { NONE = 0, FENCE = 1, RELACQ = 2 };  // RELACQ: release on the writer, acquire on the reader
enum Counter { WEAK = 0, INVALID = 1, OUT00 = 2, SPIN_TIMEOUTS = 6, UNCOUNTED = 7 };
constexpr unsigned kPoison = 0xffffffffu;
constexpr long long kSpinCap = 1ll << 22;  // bounded spins: a lost flag becomes a counted timeout

struct Args {
  int test, sync0, sync1;
  int test_blocks, threads, n;  // n = instances (litmus) or pairs (pc)
  int stride, yperm;
  int blk_a, blk_c, loc_a, loc_c, loc2_a, loc2_c, partner_off;
  int barrier, pre_stress, stress_lines, stress_iters, stress_pattern;
  int iters, elems, producer_skew, consumer_skew;  // pc: producer (consumer) warp w writes (reads) w*skew*64 clocks late
  unsigned* mem;
  unsigned* res;
  unsigned* scratch;
  unsigned* ctrl;  // [0] barrier arrivals, [1] test blocks done; pc: flags at [16..], acks after
  unsigned long long seed;
};

__device__ __forceinline__ unsigned ld_plain_or_acquire(const unsigned* p, bool acquire) {
  return acquire ? hz_ld_acquire_gpu(p) : hz_ld_volatile(p);
}
__device__ __forceinline__ void st_plain_or_release(unsigned* p, unsigned v, bool release) {
  if (release) hz_st_release_gpu(p, v);
  else hz_st_volatile(p, v);
}

// Memory stress on the scratch region (never on test locations).
__device__ void stress(const Args& a, int worker, int iters, bool watch_done) {
  unsigned* line = a.scratch + (size_t)((worker / HZ_WARP_SIZE) % a.stress_lines) * 32 + (worker % 32);
  unsigned acc = 0;
  for (int it = 0; it < iters; ++it) {
    if (watch_done && (it & 15) == 0 && hz_ld_volatile(&a.ctrl[1]) >= (unsigned)a.test_blocks) break;
    switch (a.stress_pattern) {
      case 0: hz_st_volatile(line, it); hz_st_volatile(line, it + 1); break;    // st_st
      case 1: hz_st_volatile(line, it); acc += hz_ld_volatile(line); break;     // st_ld
      case 2: acc += hz_ld_volatile(line); hz_st_volatile(line, it); break;     // ld_st
      default: acc += hz_ld_volatile(line); acc += hz_ld_volatile(line); break; // ld_ld
    }
  }
  if (acc == 0x9e3779b9u) hz_st_volatile(line, acc);  // keep the loads alive
}

__global__ void litmus_kernel(Args a, hz::DeviceCheck* check) {
  const int G = gridDim.x;
  const int role = (int)(((long long)a.blk_a * blockIdx.x + a.blk_c) % G);
  if (role >= a.test_blocks) {  // a stress block
    stress(a, (role - a.test_blocks) * blockDim.x + threadIdx.x, a.stress_iters, true);
    return;
  }
  const int T = a.threads;
  const int lt = (a.loc_a * (int)threadIdx.x + a.loc_c) & (T - 1);
  const int id0 = role * T + lt;
  const int id1 = ((role + a.partner_off) % a.test_blocks) * T + ((a.loc2_a * lt + a.loc2_c) & (T - 1));
  if (a.pre_stress) stress(a, role * T + lt, a.pre_stress, false);
  if (a.barrier) {  // spin barrier over the test blocks: start the instances together
    __syncthreads();
    if (threadIdx.x == 0) {
      atomicAdd(&a.ctrl[0], 1u);
      long long spins = 0;
      while (hz_ld_volatile(&a.ctrl[0]) < (unsigned)a.test_blocks && ++spins < kSpinCap) {
      }
      if (spins >= kSpinCap) atomicAdd(&check->counters[SPIN_TIMEOUTS], 1ull);
    }
    __syncthreads();
  }
  unsigned* x0 = a.mem + (size_t)id0 * a.stride;
  unsigned* y0 = a.mem + ((size_t)a.n + (size_t)(((long long)id0 * a.yperm) % a.n)) * a.stride;
  unsigned* x1 = a.mem + (size_t)id1 * a.stride;
  unsigned* y1 = a.mem + ((size_t)a.n + (size_t)(((long long)id1 * a.yperm) % a.n)) * a.stride;
  const bool f0 = a.sync0 == FENCE, f1 = a.sync1 == FENCE;
  const bool rel = a.sync0 == RELACQ, acq = a.sync1 == RELACQ;
  // Thread role 0 of instance id0, then role 1 of instance id1 (a different block).
  switch (a.test) {
    case MP: {  // T0: x=1; y=1   T1: r0=y; r1=x   weak: r0=1, r1=0
      hz_st_volatile(x0, 1);
      if (f0) hz_fence_gpu();
      st_plain_or_release(y0, 1, rel);
      unsigned r0 = ld_plain_or_acquire(y1, acq);
      if (f1) hz_fence_gpu();
      unsigned r1 = hz_ld_volatile(x1);
      a.res[2 * (size_t)id1] = r0;
      a.res[2 * (size_t)id1 + 1] = r1;
      break;
    }
    case SB: {  // T0: x=1; r0=y   T1: y=1; r1=x   weak: r0=0, r1=0
      st_plain_or_release(x0, 1, rel);  // (release/acquire do not order store->load:
      if (f0) hz_fence_gpu();            //  only the fences forbid SB)
      a.res[2 * (size_t)id0] = hz_ld_volatile(y0);
      hz_st_volatile(y1, 1);
      if (f1) hz_fence_gpu();
      a.res[2 * (size_t)id1 + 1] = ld_plain_or_acquire(x1, acq);
      break;
    }
    case LB: {  // T0: r0=x; y=1   T1: r1=y; x=1   weak: r0=1, r1=1
      unsigned r0 = hz_ld_volatile(x0);
      if (f0) hz_fence_gpu();
      st_plain_or_release(y0, 1, rel);
      unsigned r1 = ld_plain_or_acquire(y1, acq);
      if (f1) hz_fence_gpu();
      hz_st_volatile(x1, 1);
      a.res[2 * (size_t)id0] = r0;
      a.res[2 * (size_t)id1 + 1] = r1;
      break;
    }
    default: {  // CoRR  T0: x=1   T1: r0=x; r1=x   weak: r0=1, r1=0
      hz_st_volatile(x0, 1);
      unsigned r0 = ld_plain_or_acquire(x1, acq);
      if (f1) hz_fence_gpu();
      unsigned r1 = hz_ld_volatile(x1);
      a.res[2 * (size_t)id1] = r0;
      a.res[2 * (size_t)id1 + 1] = r1;
      break;
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) atomicAdd(&a.ctrl[1], 1u);  // lets the stress blocks stop
}

// Classify every instance, count outcomes, then reset the test state for the next launch.
__global__ void __launch_bounds__(256) litmus_check(Args a, long launch, hz::DeviceCheck* check, unsigned* bits) {
  __shared__ unsigned long long cnt[6];
  if (threadIdx.x < 6) cnt[threadIdx.x] = 0;
  __syncthreads();
  unsigned long long local[6] = {0, 0, 0, 0, 0, 0};
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (size_t)a.n; i += (size_t)gridDim.x * blockDim.x) {
    unsigned r0 = a.res[2 * i], r1 = a.res[2 * i + 1];
    if (r0 > 1 || r1 > 1) {
      local[INVALID]++;
    } else {
      bool weak = a.test == MP ? (r0 == 1 && r1 == 0)
                : a.test == SB ? (r0 == 0 && r1 == 0)
                : a.test == LB ? (r0 == 1 && r1 == 1)
                               : (r0 == 1 && r1 == 0);
      local[WEAK] += weak;
      // (constant indices keep `local` in registers)
      local[OUT00 + 0] += (r0 == 0 && r1 == 0);
      local[OUT00 + 1] += (r0 == 0 && r1 == 1);
      local[OUT00 + 2] += (r0 == 1 && r1 == 0);
      local[OUT00 + 3] += (r0 == 1 && r1 == 1);
    }
    a.res[2 * i] = kPoison;
    a.res[2 * i + 1] = kPoison;
    a.mem[i * a.stride] = 0;
    a.mem[((size_t)a.n + i) * a.stride] = 0;
  }
#pragma unroll
  for (int k = 0; k < 6; ++k)
    if (local[k]) atomicAdd(&cnt[k], local[k]);
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int k = 0; k < 6; ++k)
      if (cnt[k]) atomicAdd(&check->counters[k], cnt[k]);
    // Every instance this block classified is in exactly one of invalid/outcome_*: a sum off
    // the block's share of n is the check's own bookkeeping failing (a count lost or read
    // before every warp added it). Without this sum such a loss is invisible in the fixed
    // variants, which have no weak outcome to lose.
    const unsigned long long seen = cnt[INVALID] + cnt[OUT00] + cnt[OUT00 + 1] + cnt[OUT00 + 2] + cnt[OUT00 + 3];
    const unsigned long long want = hz::grid_stride_count((unsigned long long)a.n, blockIdx.x, blockDim.x, gridDim.x);
    const unsigned long long off = seen > want ? seen - want : want - seen;
    if (off) atomicAdd(&check->counters[UNCOUNTED], off);
    hz::hz_report_bad(check, bits, launch, cnt[WEAK] + cnt[INVALID] + off, 0.f);
  }
  if (blockIdx.x == 0 && threadIdx.x < 2) a.ctrl[threadIdx.x] = 0;
}

__device__ __forceinline__ unsigned pc_value(unsigned long long seed, int pair, int it, int k) {
  return (unsigned)hz::splitmix64(seed ^ ((unsigned long long)pair << 40) ^ ((unsigned long long)it << 20) ^ k);
}

// Persistent producer/consumer: blocks [0, n) produce, [n, 2n) consume; pair j reuses one
// buffer for `iters` iterations. The ack channel (consumer -> producer) is always correctly
// ordered (st.release / volatile spin + fence): only the data channel carries the seeded
// hazards.
__global__ void pc_kernel(Args a, long launch, hz::DeviceCheck* check, unsigned* bits) {
  const bool producer = (int)blockIdx.x < a.n;
  const int pair = producer ? blockIdx.x : blockIdx.x - a.n;
  const int L = a.threads * a.elems;
  unsigned* data = a.mem + (size_t)pair * L;
  unsigned* flag = a.ctrl + 16 + pair;
  unsigned* ack = a.ctrl + 16 + a.n + pair;
  __shared__ unsigned stale_block;
  __shared__ int timed_out;
  if (threadIdx.x == 0) timed_out = 0;
  for (int it = 1; it <= a.iters; ++it) {
    if (producer) {
      if (threadIdx.x == 0) {  // wait until the consumer has finished reading it-1
        long long spins = 0;
        while (hz_ld_volatile(ack) != (unsigned)(it - 1) && ++spins < kSpinCap) {
        }
        if (spins >= kSpinCap) timed_out = 1;
        hz_fence_gpu();
      }
      __syncthreads();
      if (timed_out) break;
      // Producer (consumer) skew, timing only: the barrier after the data writes (reads) waits for
      // the late warps, so the flag (ack) is right for any skew; without it, it goes out before them.
      hz_spin_cycles(HZ_WARP_SKEW_CYCLES(threadIdx.x / HZ_WARP_SIZE, a.producer_skew));
      for (int k = threadIdx.x; k < L; k += blockDim.x) data[k] = pc_value(a.seed, pair, it, k);
      __syncthreads();
      if (threadIdx.x == 0) {
        if (a.sync0 == FENCE) hz_fence_gpu();  // release: data before flag
        st_plain_or_release(flag, (unsigned)it, a.sync0 == RELACQ);
      }
    } else {
      if (threadIdx.x == 0) {
        stale_block = 0;
        long long spins = 0;
        while (ld_plain_or_acquire(flag, a.sync1 == RELACQ) != (unsigned)it && ++spins < kSpinCap) {}
        if (spins >= kSpinCap) timed_out = 1;
        if (a.sync1 == FENCE) hz_fence_gpu();  // acquire: flag before data
      }
      __syncthreads();
      if (timed_out) break;
      hz_spin_cycles(HZ_WARP_SKEW_CYCLES(threadIdx.x / HZ_WARP_SIZE, a.consumer_skew));  // see the producer's skew
      unsigned stale = 0;
      for (int k = threadIdx.x; k < L; k += blockDim.x) stale += data[k] != pc_value(a.seed, pair, it, k);
      if (stale) atomicAdd(&stale_block, stale);
      __syncthreads();
      if (threadIdx.x == 0) {
        if (stale_block) {
          atomicAdd(&check->counters[WEAK], 1ull);
          hz::hz_report_bad(check, bits, launch, stale_block, 0.f);
        }
        // release: reads done before the ack. st.release, not __threadfence: fence.sc
        // also invalidates this SM's L1 (CCTL.IVALL in SASS), which would hide the stale
        // lines the no-acquire variant exists to expose.
        hz_st_release_gpu(ack, (unsigned)it);
      }
    }
  }
  __syncthreads();
  if (threadIdx.x == 0 && timed_out) {
    atomicAdd(&check->counters[SPIN_TIMEOUTS], 1ull);
    hz::hz_report_bad(check, bits, launch, 1, 0.f);
  }
  if (!producer && threadIdx.x == 0) {  // reset this pair for the next launch
    hz_st_volatile(flag, 0);
    hz_st_volatile(ack, 0);
  }
}

// ------------------------------------------------------------------------------ host --
int parse_test(const std::string& s) {
  return s == "mp" ? MP : s == "sb" ? SB : s == "lb" ? LB : s == "corr" ? CORR : PC;
}
int parse_sync(const std::string& s) { return s == "none" ? NONE : s == "fence" ? FENCE : RELACQ; }

int test_blocks(const hz::Params& p, const hz::Device& d) {
  long long b = p.i("test_blocks");
  return (int)(b > 0 ? b : d.prop.multiProcessorCount);
}

int max_resident(const void* kernel, int threads, const hz::Device& d) {
  int per_sm = 0;
  HZ_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0));
  return per_sm * d.prop.multiProcessorCount;
}

void validate(const hz::Params& p, const hz::Device& d) {
  const int threads = (int)p.i("threads");
  if (threads & (threads - 1)) throw hz::BadRequest("threads must be a power of two");
  const int tb = test_blocks(p, d);
  const bool pc = p.s("test") == "pc";
  const int grid = pc ? 2 * tb : tb + (int)p.i("stress_blocks");
  const int cap = max_resident(pc ? (const void*)pc_kernel : (const void*)litmus_kernel, threads, d);
  // Every block spins on another one: all of them must be resident at once, or it hangs.
  if (grid > cap)
    throw hz::BadRequest("grid of " + std::to_string(grid) + " blocks exceeds the " + std::to_string(cap) +
                         " co-resident blocks this kernel can have (spinning blocks would deadlock)");
  if (!pc && tb < 2) throw hz::BadRequest("litmus tests need test_blocks >= 2");
}

struct State {
  unsigned *mem = nullptr, *res = nullptr, *scratch = nullptr, *ctrl = nullptr;
  size_t mem_words = 0, res_words = 0, scratch_words = 0, ctrl_words = 0;
  static void grow(unsigned*& p, size_t& have, size_t need) {
    if (need <= have) return;
    if (p) HZ_CHECK(cudaFree(p));
    HZ_CHECK(cudaMalloc(&p, need * sizeof(unsigned)));
    have = need;
  }
} g_state;

int gcd(int a, int b) { return b ? gcd(b, a % b) : a; }

// A multiplier coprime with n, drawn from the seed (identity when not shuffling).
int coprime_multiplier(int n, uint64_t r) {
  if (n <= 2) return 1;
  for (int tries = 0; tries < 64; ++tries) {
    int m = 1 + (int)(hz::splitmix64(r + tries) % (uint64_t)(n - 1));
    if (gcd(m, n) == 1) return m;
  }
  return 1;
}

void run(hz::Batch& b) {
  const hz::Params& p = b.params;
  Args a{};
  a.test = parse_test(p.s("test"));
  a.sync0 = parse_sync(p.s("writer_sync"));
  a.sync1 = parse_sync(p.s("reader_sync"));
  a.test_blocks = test_blocks(p, b.device);
  a.threads = (int)p.i("threads");
  a.stride = (int)p.i("stride");
  a.barrier = p.b("barrier");
  a.pre_stress = (int)p.i("pre_stress");
  a.stress_lines = (int)p.i("stress_lines");
  a.stress_iters = (int)p.i("stress_iters");
  const std::string pat = p.s("stress_pattern");
  a.stress_pattern = pat == "st_st" ? 0 : pat == "st_ld" ? 1 : pat == "ld_st" ? 2 : 3;
  a.iters = (int)p.i("iters");
  a.elems = (int)p.i("elems");
  a.producer_skew = (int)p.i("producer_skew");
  a.consumer_skew = (int)p.i("consumer_skew");
  const bool pc = a.test == PC;
  const int stress_blocks = pc ? 0 : (int)p.i("stress_blocks");
  const int grid = pc ? 2 * a.test_blocks : a.test_blocks + stress_blocks;
  a.n = pc ? a.test_blocks : a.test_blocks * a.threads;
  a.yperm = p.b("permute") ? coprime_multiplier(a.n, b.seed ^ 0x5151) : 1;

  State& s = g_state;
  const size_t mem_words = pc ? (size_t)a.n * a.threads * a.elems : 2 * (size_t)a.n * a.stride;
  State::grow(s.mem, s.mem_words, mem_words);
  State::grow(s.res, s.res_words, 2 * (size_t)a.n);
  State::grow(s.scratch, s.scratch_words, (size_t)a.stress_lines * 32);
  State::grow(s.ctrl, s.ctrl_words, 16 + 2 * (size_t)a.n);
  a.mem = s.mem;
  a.res = s.res;
  a.scratch = s.scratch;
  a.ctrl = s.ctrl;
  HZ_CHECK(cudaMemsetAsync(s.mem, 0, mem_words * sizeof(unsigned), b.stream));
  HZ_CHECK(cudaMemsetAsync(s.ctrl, 0, (16 + 2 * (size_t)a.n) * sizeof(unsigned), b.stream));
  b.poison(s.res, 2 * (size_t)a.n * sizeof(unsigned));
  const bool shuffle = p.b("shuffle");
  const double instances = pc ? (double)a.n * a.iters : (double)a.n;
  b.metric("instances_per_launch", instances);
  b.metric("instances", instances * b.launches);
  b.metric("grid", grid);
  b.timer_start();
  for (long i = 0; i < b.launches; ++i) {
    const uint64_t r = hz::splitmix64(b.seed + (uint64_t)i);
    a.seed = r;
    a.blk_a = shuffle ? coprime_multiplier(grid, r ^ 1) : 1;
    a.blk_c = shuffle ? (int)(hz::splitmix64(r ^ 2) % (uint64_t)grid) : 0;
    a.loc_a = shuffle ? (int)(hz::splitmix64(r ^ 3) % (uint64_t)a.threads) | 1 : 1;
    a.loc_c = shuffle ? (int)(hz::splitmix64(r ^ 4) % (uint64_t)a.threads) : 0;
    a.loc2_a = shuffle ? (int)(hz::splitmix64(r ^ 5) % (uint64_t)a.threads) | 1 : 1;
    a.loc2_c = shuffle ? (int)(hz::splitmix64(r ^ 6) % (uint64_t)a.threads) : 0;
    a.partner_off = shuffle && a.test_blocks > 2 ? 1 + (int)(hz::splitmix64(r ^ 7) % (uint64_t)(a.test_blocks - 1)) : 1;
    if (pc) {
      pc_kernel<<<a.test_blocks * 2, a.threads, 0, b.stream>>>(a, i, b.check, b.launch_bits);
      HZ_CHECK_LAUNCH();
    } else {
      litmus_kernel<<<grid, a.threads, 0, b.stream>>>(a, b.check);
      HZ_CHECK_LAUNCH();
      // The check also resets the test locations: it runs in raw mode too (the state must
      // be clean for the next launch), so the raw loop of this family includes it.
      litmus_check<<<b.grid_for(a.n), 256, 0, b.stream>>>(a, i, b.check, b.launch_bits);
      HZ_CHECK_LAUNCH();
    }
    b.launched();
  }
  b.timer_stop();
}

// Parameters, variants and counters: standalone/ordering/family.toml (embedded by the build).
hz::FamilySpec ordering_spec() { return {validate, run}; }

}  // namespace

HZ_FAMILY_MAIN(ordering_spec)
