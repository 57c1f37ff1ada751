// barrier_layout_host.h -- the harness side of family `barrier_layout` (included once, at
// the end of barrier_layout.cu, after the device code).
//
// Runtime build: every poll x release kind is one template instance of `hz_barrier_kernel`;
// after every launch `hz_barrier_check` judges it on the device (data words seen wrong,
// spins that timed out, and the barrier's final state: counter = epochs x producers,
// done = epochs x consumers, every release flag = epochs) and resets the barrier and the
// control words for the next launch. In raw mode (--raw-loop) the check still runs - it is
// the reset - but reports nothing. Point build: the same parameters and variants are
// listed, but every request is refused (the binary exists to be compiled and disassembled).
#pragma once

#include <string>

namespace {

enum Counter { SPIN_TIMEOUTS = 0, WRONG_WORDS = 1, BAD_FINAL_WORDS = 2, ABORTED_LAUNCHES = 3, DEVICE_NS = 4 };

#if HZ_POINT_BUILD
void validate(const hz::Params&, const hz::Device&) {
  throw hz::BadRequest("this binary is a point build (-DHZ_SLOT_STRIDE/-DHZ_DONE_OFFSET/-DHZ_POLL/-DHZ_RELEASE) "
                       "for the static checks, with unbounded spins; build it without -D parameters to run it");
}
void run(hz::Batch&) {}
#else
struct Args {
  uint32_t* bar;
  uint32_t* data;
  RunCtl rc;
  BarrierLayout L;
  int producers, consumers, words, epochs;
};

template <int Poll, int Release>
__global__ void __launch_bounds__(HZ_THREADS) hz_barrier_kernel(Args a) {
  hz_barrier_rounds<Poll, Release>(a.L, a.bar, a.data, a.rc, a.producers, a.consumers, a.words, a.epochs);
}

// Judge launch `launch` (when `judge`), then reset the barrier words and the control words.
// Plain loads are enough: the barrier kernel finished before this one started (stream order).
__global__ void __launch_bounds__(256) hz_barrier_check(Args a, int bar_words, long launch, hz::DeviceCheck* check,
                                                        unsigned* bits, int judge) {
  LaunchCtl* c = a.rc.ctl;
  if (threadIdx.x == 0) {
    const uint32_t aborted = c->abort;
    uint32_t final_bad = 0;
    if (!aborted) {  // after a timeout the epoch loops were left early: the counts are partial
      final_bad += *hz_word(a.bar, a.L.counter) != (uint32_t)(a.epochs * a.producers);
      final_bad += *hz_word(a.bar, a.L.done) != (uint32_t)(a.epochs * a.consumers);
      for (int x = 0; x < HZ_RELEASES; ++x) final_bad += *hz_word(a.bar, x * a.L.slot_stride) != (uint32_t)a.epochs;
    }
    if (c->t_last > c->t_first) atomicAdd(&check->counters[DEVICE_NS], c->t_last - c->t_first);
    if (judge) {
      atomicAdd(&check->counters[SPIN_TIMEOUTS], (unsigned long long)c->timeouts);
      atomicAdd(&check->counters[WRONG_WORDS], (unsigned long long)c->wrong);
      atomicAdd(&check->counters[BAD_FINAL_WORDS], (unsigned long long)final_bad);
      atomicAdd(&check->counters[ABORTED_LAUNCHES], (unsigned long long)aborted);
      hz::hz_report_bad(check, bits, launch, (unsigned long long)c->wrong + final_bad + c->timeouts, 0.f);
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < bar_words; i += blockDim.x) a.bar[i] = 0;
  if (threadIdx.x == 0) {
    c->abort = c->timeouts = c->wrong = 0;
    c->t_first = ~0ull;
    c->t_last = 0;
  }
}

using KernelFn = void (*)(Args);

KernelFn pick_kernel(int poll, int release) {
  switch (poll * 3 + release) {
    case 0: return hz_barrier_kernel<POLL_ACQUIRE, REL_WRITE_THROUGH>;
    case 1: return hz_barrier_kernel<POLL_ACQUIRE, REL_STORE_RELEASE>;
    case 2: return hz_barrier_kernel<POLL_ACQUIRE, REL_ATOMIC>;
    case 3: return hz_barrier_kernel<POLL_VOLATILE, REL_WRITE_THROUGH>;
    case 4: return hz_barrier_kernel<POLL_VOLATILE, REL_STORE_RELEASE>;
    case 5: return hz_barrier_kernel<POLL_VOLATILE, REL_ATOMIC>;
    case 6: return hz_barrier_kernel<POLL_PLAIN, REL_WRITE_THROUGH>;
    case 7: return hz_barrier_kernel<POLL_PLAIN, REL_STORE_RELEASE>;
    case 8: return hz_barrier_kernel<POLL_PLAIN, REL_ATOMIC>;
  }
  throw hz::BadRequest("poll and release must be 0..2");
}

BarrierLayout layout_of(const hz::Params& p) {
  const int stride = (int)p.i("slot_stride");
  return {stride, HZ_RELEASES * stride, (int)p.i("done_offset")};
}

int grid_blocks(const hz::Params& p, const hz::Device& d) {
  const long long b = p.i("blocks");
  return (int)(b > 0 ? b : d.prop.multiProcessorCount);
}

int producer_blocks(const hz::Params& p, int grid) {
  const long long n = p.i("producers");
  return (int)(n > 0 ? n : (grid / 8 > 0 ? grid / 8 : 1));
}

// How many release flags share the arrival counter's 128-B line (NVIDIA's line size).
int flags_in_counter_line(const BarrierLayout& L) {
  int n = 0;
  for (int x = 0; x < HZ_RELEASES; ++x) n += (x * L.slot_stride) / 128 == L.counter / 128;
  return n;
}

void validate(const hz::Params& p, const hz::Device& d) {
  const BarrierLayout L = layout_of(p);
  if (L.slot_stride % 4 || L.done % 4) throw hz::BadRequest("slot_stride and done_offset must be multiples of 4");
  for (int x = 0; x <= HZ_RELEASES; ++x)  // x = HZ_RELEASES: the arrival counter
    if (L.done == x * L.slot_stride)
      throw hz::BadRequest("done_offset " + std::to_string(L.done) + " is the word of " +
                           (x < HZ_RELEASES ? "release flag " + std::to_string(x) : std::string("the arrival counter")));
  const int grid = grid_blocks(p, d), producers = producer_blocks(p, grid);
  if (producers >= grid) throw hz::BadRequest("need at least one consumer block: producers < blocks");
  if ((double)producers * p.i("words") * 4 > 1e9) throw hz::BadRequest("producers x words exceeds 1 GB");
  if (p.i("drop_release") > p.i("epochs")) throw hz::BadRequest("drop_release names an epoch after the last one");
  int per_sm = 0;
  HZ_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
      &per_sm, (const void*)pick_kernel((int)p.i("poll"), (int)p.i("release")), HZ_THREADS, 0));
  const int cap = per_sm * d.prop.multiProcessorCount;
  // Every block spins on others: all of them must be resident at once.
  if (grid > cap)
    throw hz::BadRequest("grid of " + std::to_string(grid) + " blocks exceeds the " + std::to_string(cap) +
                         " co-resident blocks this kernel can have");
}

struct Buffers {
  uint32_t* bar = nullptr;
  uint32_t* data = nullptr;
  LaunchCtl* ctl = nullptr;
  size_t bar_bytes = 0, data_words = 0;
  void ensure(size_t bar_need, size_t data_need) {
    if (!ctl) HZ_CHECK(cudaMalloc((void**)&ctl, sizeof(LaunchCtl)));  // its own allocation: never in a barrier line
    if (bar_need > bar_bytes) {
      if (bar) HZ_CHECK(cudaFree(bar));
      HZ_CHECK(cudaMalloc((void**)&bar, bar_need));  // cudaMalloc: 256-B aligned, so line-aligned
      bar_bytes = bar_need;
    }
    if (data_need > data_words) {
      if (data) HZ_CHECK(cudaFree(data));
      HZ_CHECK(cudaMalloc((void**)&data, data_need * 4));
      data_words = data_need;
    }
  }
} g_buf;

void run(hz::Batch& b) {
  const hz::Params& p = b.params;
  Args a{};
  a.L = layout_of(p);
  const int grid = grid_blocks(p, b.device);
  a.producers = producer_blocks(p, grid);
  a.consumers = grid - a.producers;
  a.words = (int)p.i("words");
  a.epochs = (int)p.i("epochs");
  const size_t last = (size_t)(a.L.counter > a.L.done ? a.L.counter : a.L.done) + 4;
  const size_t bar_bytes = (last + 127) / 128 * 128;
  g_buf.ensure(bar_bytes, (size_t)a.producers * a.words);
  a.bar = g_buf.bar;
  a.data = g_buf.data;
  a.rc.ctl = g_buf.ctl;
  a.rc.limit_ns = (unsigned long long)p.i("spin_timeout_us") * 1000ull;
  a.rc.jitter = (int)p.i("jitter");
  a.rc.drop_epoch = (int)p.i("drop_release");
  KernelFn kernel = pick_kernel((int)p.i("poll"), (int)p.i("release"));
  HZ_CHECK(cudaMemsetAsync(g_buf.bar, 0, bar_bytes, b.stream));
  HZ_CHECK(cudaMemsetAsync(g_buf.ctl, 0, sizeof(LaunchCtl), b.stream));
  HZ_CHECK(cudaMemsetAsync(&g_buf.ctl->t_first, 0xFF, sizeof(unsigned long long), b.stream));
  b.metric("blocks", grid);
  b.metric("producers", a.producers);
  b.metric("consumers", a.consumers);
  b.metric("flags_in_counter_line", flags_in_counter_line(a.L));
  b.metric("done_in_counter_line", a.L.done / 128 == a.L.counter / 128 ? 1 : 0);
  b.timer_start();
  for (long i = 0; i < b.launches; ++i) {
    a.rc.seed = hz::splitmix64(b.seed + (uint64_t)i);
    kernel<<<grid, HZ_THREADS, 0, b.stream>>>(a);
    HZ_CHECK_LAUNCH();
    hz_barrier_check<<<1, 256, 0, b.stream>>>(a, (int)(bar_bytes / 4), i, b.check, b.launch_bits, b.validate);
    HZ_CHECK_LAUNCH();
    b.launched();
  }
  b.timer_stop();
  // The barrier's own time: first block start to last block end, summed on the device.
  unsigned long long ns = 0;
  HZ_CHECK(cudaMemcpyAsync(&ns, &b.check->counters[DEVICE_NS], sizeof ns, cudaMemcpyDeviceToHost, b.stream));
  HZ_CHECK(cudaStreamSynchronize(b.stream));
  const double rounds = (double)b.launches * a.epochs;
  b.metric("barrier_rounds", rounds);
  b.metric("ns_per_barrier", ns / rounds);
}
#endif  // HZ_POINT_BUILD

// Parameters, variants and counters: standalone/barrier_layout/family.toml (embedded by the build).
hz::FamilySpec barrier_layout_spec() { return {validate, run}; }

}  // namespace

HZ_FAMILY_MAIN(barrier_layout_spec)
