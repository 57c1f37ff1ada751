// harness.h -- the standalone kernel harness every family binary is built on.
//
// A family is a folder `standalone/<family>/` with a `family.toml` (its parameters, named
// variants = parameter presets, counters; docs/family-table.md) and one .cu file that defines
// a `hz::FamilySpec` (a `run(Batch&)` function that launches and validates one batch, and an
// optional `validate`) and ends with `HZ_FAMILY_MAIN(spec_function)`. The build embeds the
// table as the generated header hz_family_table.h. The harness supplies:
//
//   BIN --list                   variants and parameters as one JSON object (no GPU needed)
//   BIN --resolve JSON           `HZ_RESOLVED {"variant":..,"resolved":{..}}`: the point a request
//                                runs (no GPU needed); exit 2 with the message for a bad one
//   BIN --once [JSON]            one batch; prints `HZ_RESULT {...}`; exit 0 clean,
//                                1 mismatch, 2 bad request/reference, 3 device fault,
//                                4 unsupported by this build (hz::Unsupported).
//                                JSON is a request ({"launches":N,"params":{...}}) or a bare
//                                params object; without JSON the env var HZ_PARAMS is read.
//   BIN --serve                  the JSON-lines server of docs/protocol.md (version 1)
//   BIN --raw-loop N [JSON]      N launches without validation or protocol, timed in-process
//                                (the baseline for the server-throughput benchmark)
//
// Every CUDA call goes through HZ_CHECK; any CUDA error is treated as a device fault (the
// context may be poisoned): the server replies status "fault" and exits 3. See
// docs/harness.md for the full contract.
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "check.cuh"
#include "compat.h"
#include "json.h"
#include "pace.h"

namespace hz {

constexpr int kProtocolVersion = 1;

// ----------------------------------------------------------------------------- errors --
struct DeviceFault : std::runtime_error {
  using std::runtime_error::runtime_error;
};
struct BadRequest : std::runtime_error {  // the request cannot be served (bad parameter)
  using std::runtime_error::runtime_error;
};
struct BadReference : std::runtime_error {  // the reference failed its own validation
  using std::runtime_error::runtime_error;
};
// This build cannot run the request: a well-formed point needing a feature the platform lacks
// (cp.async in a HIP build). Replied as "unsupported", never as a bad request: on another
// platform the same request is good.
struct Unsupported : std::runtime_error {
  using std::runtime_error::runtime_error;
};

inline void check_cuda(cudaError_t e, const char* expr, const char* file, int line) {
  if (e == cudaSuccess) return;
  char buf[512];
  std::snprintf(buf, sizeof buf, "%s: %s (%s at %s:%d)", cudaGetErrorName(e), cudaGetErrorString(e), expr, file, line);
  throw DeviceFault(buf);
}
#define HZ_CHECK(expr) ::hz::check_cuda((expr), #expr, __FILE__, __LINE__)
// After every kernel launch: launch-configuration errors and earlier sticky errors.
#define HZ_CHECK_LAUNCH() ::hz::check_cuda(cudaGetLastError(), "kernel launch", __FILE__, __LINE__)

// ------------------------------------------------------------------------- parameters --
// A family's parameters, variants and counters are not written here or in the family's
// .cu: they live in `standalone/<family>/family.toml`, which the build embeds as the
// generated header hz_family_table.h (the table as JSON). `FamilyTable::parse` reads it at
// startup; the family's C++ keeps only its behaviour (`FamilySpec`: validate, run).
struct ParamSpec {
  std::string name;
  std::string kind;  // "int" | "bool" | "str"
  json::Value def;
  double lo = 0, hi = 0;             // inclusive range for "int"
  std::vector<json::Value> choices;  // allowed values: always for "str", optional for "int"
  std::string doc;
};

// A named preset: `params` (an object) overrides the defaults.
struct VariantSpec {
  std::string name;
  std::string role;  // reference | fixed | broken
  std::string description;
  json::Value params;
};

// The family's table, parsed from the JSON the build generated from family.toml.
struct FamilyTable {
  std::string name;
  std::string summary;
  std::vector<ParamSpec> params;
  std::vector<VariantSpec> variants;       // the first one is the default
  std::vector<std::string> counter_names;  // DeviceCheck::counters reported as metrics

  // Throws std::logic_error naming what is wrong: a table that does not parse is a build bug.
  static FamilyTable parse(const std::string& text);
};

// Resolved parameters of one request: defaults <- variant preset <- explicit fields.
class Params {
 public:
  std::string variant;
  json::Value values;  // object, every declared parameter present

  long long i(const std::string& k) const { return (long long)at(k).num; }
  bool b(const std::string& k) const { return at(k).b; }
  const std::string& s(const std::string& k) const { return at(k).str; }
  const json::Value& at(const std::string& k) const {
    const json::Value* v = values.get(k);
    if (!v) throw std::logic_error("family read undeclared parameter " + k);
    return *v;
  }
};

struct Device {
  int ordinal = 0;
  cudaDeviceProp prop{};
  std::string uuid;  // "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", as NVML spells it
};

// ----------------------------------------------------------------------------- batch --
// What a family's run() gets: the resolved parameters, the batch's seed and launch count,
// the stream, and the device-side check buffers. In raw mode (--raw-loop) `validate` is
// false: the family must launch exactly the same kernels and skip poisoning/comparison.
class Batch {
 public:
  const Params& params;
  const Device& device;
  uint64_t seed;
  long launches;
  bool validate;
  cudaStream_t stream;
  DeviceCheck* check;     // device pointer
  unsigned* launch_bits;  // device pointer, one bit per launch

  Batch(const Params& p, const Device& d, uint64_t s, long n, bool v, cudaStream_t st, DeviceCheck* c, unsigned* bits)
      : params(p), device(d), seed(s), launches(n), validate(v), stream(st), check(c), launch_bits(bits) {}

  // Fill `n` floats with uniform values in [lo, hi), a function of (batch seed, salt).
  void fill_uniform(float* p, size_t n, float lo, float hi, uint64_t salt) {
    hz_fill_uniform_kernel<<<grid_for(n), 256, 0, stream>>>(p, n, lo, hi, splitmix64(seed ^ splitmix64(salt)));
    HZ_CHECK_LAUNCH();
  }
  // Overwrite `bytes` with 0xFF: NaN for floats, 0xFFFFFFFF for words (never a valid result).
  void poison(void* p, size_t bytes) { HZ_CHECK(cudaMemsetAsync(p, 0xFF, bytes, stream)); }
  // Compare launch `launch`'s output with the reference on the device; re-poisons `out`.
  void compare_f32(float* out, const float* ref, size_t n, long launch, float rtol = 0.f, float atol = 0.f) {
    hz_compare_f32_kernel<<<grid_for(n), 256, 0, stream>>>(out, ref, n, rtol, atol, launch, check, launch_bits, 1);
    HZ_CHECK_LAUNCH();
  }
  // Bracket the launch loop; kernel_ms in the reply is the time between the two (events).
  void timer_start() { HZ_CHECK(cudaEventRecord(ev_[0], stream)); timed_ = true; }
  void timer_stop() { HZ_CHECK(cudaEventRecord(ev_[1], stream)); }
  // Once per launch, after its last kernel: at most kQueueDepth launches stay queued ahead of
  // the GPU, so the heartbeat's tail event completes within its interval (pace.h). A hung
  // launch blocks here (the supervisor's stall window ends the process); a fault throws.
  void launched() {
    pace_launch(
        pace_, kQueueDepth, paced_++, [](cudaEvent_t e) { HZ_CHECK(cudaEventSynchronize(e)); },
        [this](cudaEvent_t e) { HZ_CHECK(cudaEventRecord(e, stream)); });
  }
  // A host-side number reported under "metrics".
  void metric(const std::string& name, double v) { metrics_.raw(name, json::number(v)); }
  void metric(const std::string& name, const std::string& v) { metrics_.str(name, v); }

  int grid_for(size_t n) const {
    size_t blocks = (n + 255) / 256;
    size_t cap = (size_t)device.prop.multiProcessorCount * 8;
    return (int)(blocks < cap ? (blocks ? blocks : 1) : cap);
  }

  // harness internals
  cudaEvent_t ev_[2] = {nullptr, nullptr};
  cudaEvent_t* pace_ = nullptr;  // the Runner's ring, kQueueDepth events
  long paced_ = 0;               // launches of this batch passed to launched()
  bool timed_ = false;
  json::Writer metrics_;
};

// A family's behaviour; everything it declares is in its table (FamilyTable).
struct FamilySpec {
  std::function<void(const Params&, const Device&)> validate;  // throw BadRequest; may be empty
  std::function<void(Batch&)> run;
};

// ------------------------------------------------------------------ request handling --
namespace detail {

inline const ParamSpec* find_param(const FamilyTable& f, const std::string& k) {
  for (const auto& p : f.params)
    if (p.name == k) return &p;
  return nullptr;
}

inline void set_value(json::Value& obj, const std::string& k, const json::Value& v) {
  for (auto& kv : obj.obj)
    if (kv.first == k) { kv.second = v; return; }
  obj.obj.emplace_back(k, v);
}

inline bool same_value(const json::Value& a, const json::Value& b) {
  if (a.type != b.type) return false;
  return a.type == json::Value::String ? a.str == b.str : a.type == json::Value::Number ? a.num == b.num : a.b == b.b;
}

// Check one value against its declaration; throws BadRequest naming the parameter.
inline void check_value(const ParamSpec& ps, const json::Value& v) {
  const std::string& k = ps.name;
  if (ps.kind == "int") {
    if (!v.is_integer()) throw BadRequest("parameter '" + k + "' must be an integer");
    if (v.num < ps.lo || v.num > ps.hi)
      throw BadRequest("parameter '" + k + "' = " + json::number(v.num) + " outside [" + json::number(ps.lo) + ", " +
                       json::number(ps.hi) + "]");
  } else if (ps.kind == "bool") {
    if (v.type != json::Value::Bool) throw BadRequest("parameter '" + k + "' must be true or false");
  } else if (v.type != json::Value::String) {
    throw BadRequest("parameter '" + k + "' must be a string");
  }
  if (ps.choices.empty()) return;
  for (const auto& c : ps.choices)
    if (same_value(c, v)) return;
  throw BadRequest("parameter '" + k + "' = " + json::dump(v) + " is not one of the allowed values");
}

// Apply `src` (object) to `dst` after checking names, types and ranges.
inline void apply_params(const FamilyTable& f, const json::Value& src, json::Value& dst, const char* where) {
  for (const auto& kv : src.obj) {
    if (kv.first == "variant" || kv.first == "seed") continue;
    const ParamSpec* ps = find_param(f, kv.first);
    if (!ps) throw BadRequest(std::string("unknown parameter '") + kv.first + "' in " + where);
    check_value(*ps, kv.second);
    set_value(dst, kv.first, kv.second);
  }
}

inline Params resolve(const FamilyTable& f, const json::Value& req_params) {
  if (req_params.type != json::Value::Object) throw BadRequest("params must be an object");
  Params out;
  out.values.type = json::Value::Object;
  for (const auto& p : f.params) out.values.obj.emplace_back(p.name, p.def);
  const json::Value* vn = req_params.get("variant");
  if (vn && vn->type != json::Value::String) throw BadRequest("variant must be a string");
  out.variant = vn ? vn->str : f.variants.at(0).name;
  const VariantSpec* vs = nullptr;
  for (const auto& v : f.variants)
    if (v.name == out.variant) vs = &v;
  if (!vs) throw BadRequest("unknown variant '" + out.variant + "'");
  apply_params(f, vs->params, out.values, "variant preset");
  apply_params(f, req_params, out.values, "request");
  return out;
}

// --------------------------------------------------------------------- table parsing --
inline const json::Value& member(const json::Value& obj, const std::string& key, json::Value::Type type,
                                 const std::string& where) {
  const json::Value* v = obj.get(key);
  if (!v || v->type != type) throw std::logic_error("family table: " + where + "." + key + " missing or of the wrong type");
  return *v;
}

inline ParamSpec parse_param(const json::Value& p) {
  ParamSpec ps;
  ps.name = member(p, "name", json::Value::String, "params[]").str;
  const std::string where = "params." + ps.name;
  ps.kind = member(p, "kind", json::Value::String, where).str;
  ps.doc = member(p, "doc", json::Value::String, where).str;
  const json::Value* def = p.get("default");
  if (!def) throw std::logic_error("family table: " + where + " has no default");
  ps.def = *def;
  if (ps.kind == "int") {
    ps.lo = member(p, "min", json::Value::Number, where).num;
    ps.hi = member(p, "max", json::Value::Number, where).num;
  } else if (ps.kind != "bool" && ps.kind != "str") {
    throw std::logic_error("family table: " + where + ".kind '" + ps.kind + "' is not int, bool or str");
  }
  if (const json::Value* ch = p.get("choices")) ps.choices = ch->arr;
  if (ps.kind == "str" && ps.choices.empty()) throw std::logic_error("family table: " + where + " has no choices");
  try {
    check_value(ps, ps.def);
  } catch (const BadRequest& e) {
    throw std::logic_error(std::string("family table: default of ") + e.what());
  }
  return ps;
}

}  // namespace detail

inline FamilyTable FamilyTable::parse(const std::string& text) {
  json::Value t;
  std::string err;
  if (!json::parse(text, t, err) || t.type != json::Value::Object)
    throw std::logic_error("family table is not a JSON object: " + err);
  FamilyTable f;
  f.name = detail::member(t, "family", json::Value::String, "table").str;
  f.summary = detail::member(t, "summary", json::Value::String, "table").str;
  for (const auto& p : detail::member(t, "params", json::Value::Array, "table").arr)
    f.params.push_back(detail::parse_param(p));
  for (const auto& v : detail::member(t, "variants", json::Value::Array, "table").arr) {
    VariantSpec vs;
    vs.name = detail::member(v, "name", json::Value::String, "variants[]").str;
    vs.role = detail::member(v, "role", json::Value::String, "variants." + vs.name).str;
    vs.description = detail::member(v, "description", json::Value::String, "variants." + vs.name).str;
    vs.params = detail::member(v, "params", json::Value::Object, "variants." + vs.name);
    f.variants.push_back(vs);
  }
  if (f.variants.empty()) throw std::logic_error("family table has no variants");
  for (const auto& c : detail::member(t, "counters", json::Value::Array, "table").arr) {
    if (c.type != json::Value::String) throw std::logic_error("family table: counters must be strings");
    f.counter_names.push_back(c.str);
  }
  if (f.counter_names.size() > (size_t)kNumCounters) throw std::logic_error("family table: too many counters");
  for (const auto& v : f.variants) {  // every preset must resolve: a bad table never serves
    json::Value req;
    req.type = json::Value::Object;
    json::Value name;
    name.type = json::Value::String;
    name.str = v.name;
    req.obj.emplace_back("variant", name);
    try {
      detail::resolve(f, req);
    } catch (const BadRequest& e) {
      throw std::logic_error("family table: variant " + v.name + ": " + e.what());
    }
  }
  return f;
}

namespace detail {

inline std::string format_uuid(const unsigned char* u) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1],
                u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
  return buf;
}

// HIP 5's hipDeviceProp_t has no uuid member; hipDeviceGetUuid exists in HIP 5 and 6.
inline std::string device_uuid(int device, const cudaDeviceProp& prop) {
#if HZ_HIP
  (void)prop;
  hipUUID id{};
  if (hipDeviceGetUuid(&id, device) != hipSuccess) return "GPU-unknown";
  return format_uuid(reinterpret_cast<const unsigned char*>(id.bytes));
#else
  (void)device;
  return format_uuid(reinterpret_cast<const unsigned char*>(&prop.uuid));
#endif
}

inline std::string list_json(const FamilyTable& f) {
  json::Writer w;
  w.num("hz_protocol", kProtocolVersion).str("family", f.name).str("summary", f.summary);
  std::string ps = "[";
  for (size_t i = 0; i < f.params.size(); ++i) {
    const ParamSpec& p = f.params[i];
    json::Writer pw;
    pw.str("name", p.name).str("kind", p.kind).value("default", p.def).str("doc", p.doc);
    if (p.kind == "int") pw.num("min", p.lo).num("max", p.hi);
    if (!p.choices.empty()) {
      json::Value ch;
      ch.type = json::Value::Array;
      ch.arr = p.choices;
      pw.value("choices", ch);
    }
    ps += (i ? "," : "") + pw.done();
  }
  w.raw("params", ps + "]");
  std::string vs = "[";
  for (size_t i = 0; i < f.variants.size(); ++i) {
    const VariantSpec& v = f.variants[i];
    json::Writer vw;
    vw.str("name", v.name).str("role", v.role).str("description", v.description).value("params", v.params);
    vs += (i ? "," : "") + vw.done();
  }
  w.raw("variants", vs + "]").strings("counters", f.counter_names);
  return w.done();
}

}  // namespace detail

// ------------------------------------------------------------------------ the runner --
// Owns the device, the stream and the check buffers; runs batches.
class Runner {
 public:
  Runner(const FamilyTable& t, const FamilySpec& f)
      : table_(t), fam_(f), rng_(std::random_device{}() ^ (uint64_t)getpid() << 32) {}

  void init_device() {
    int n = 0;
    HZ_CHECK(cudaGetDeviceCount(&n));
    if (n < 1) throw DeviceFault("no GPU visible");
    HZ_CHECK(cudaSetDevice(0));
    HZ_CHECK(cudaGetDeviceProperties(&dev_.prop, 0));
    dev_.uuid = detail::device_uuid(0, dev_.prop);
    HZ_CHECK(cudaStreamCreate(&stream_));
    HZ_CHECK(cudaEventCreate(&ev_[0]));
    HZ_CHECK(cudaEventCreate(&ev_[1]));
    for (cudaEvent_t& e : pace_) HZ_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    HZ_CHECK(cudaMalloc(&check_, sizeof(DeviceCheck)));
  }
  const Device& device() const { return dev_; }
  cudaStream_t stream() const { return stream_; }

  // One batch: returns the reply object (without id). Throws DeviceFault / BadRequest /
  // BadReference; the caller turns them into replies.
  std::string run_batch(const json::Value& req_params, long launches, bool validate = true,
                        double* wall_s_out = nullptr) {
    if (launches < 1 || launches > (1l << 26)) throw BadRequest("launches must be in [1, 67108864]");
    Params p = detail::resolve(table_, req_params);
    if (fam_.validate) fam_.validate(p, dev_);
    const json::Value* sv = req_params.get("seed");
    uint64_t seed;
    if (sv) {
      if (!sv->is_integer() || sv->num < 0) throw BadRequest("seed must be a non-negative integer below 2^53");
      seed = (uint64_t)sv->num;
    } else {
      seed = rng_() & ((1ull << 52) - 1);
    }
    ensure_bits(launches);
    HZ_CHECK(cudaMemsetAsync(check_, 0, sizeof(DeviceCheck), stream_));
    HZ_CHECK(cudaMemsetAsync(&check_->first_bad_launch, 0xFF, sizeof(unsigned), stream_));
    HZ_CHECK(cudaMemsetAsync(bits_, 0, ((launches + 31) / 32) * sizeof(unsigned), stream_));
    Batch b(p, dev_, seed, launches, validate, stream_, check_, bits_);
    b.ev_[0] = ev_[0];
    b.ev_[1] = ev_[1];
    b.pace_ = pace_;
    auto t0 = std::chrono::steady_clock::now();
    fam_.run(b);
    HZ_CHECK(cudaStreamSynchronize(stream_));
    double wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (wall_s_out) *wall_s_out = wall_s;
    DeviceCheck host{};
    HZ_CHECK(cudaMemcpy(&host, check_, sizeof host, cudaMemcpyDeviceToHost));
    float kernel_ms = 0.f;
    if (b.timed_) HZ_CHECK(cudaEventElapsedTime(&kernel_ms, ev_[0], ev_[1]));
    float max_rel;
    std::memcpy(&max_rel, &host.max_rel_err_bits, sizeof max_rel);
    for (size_t k = 0; k < table_.counter_names.size() && k < (size_t)kNumCounters; ++k)
      b.metric(table_.counter_names[k], (double)host.counters[k]);
    b.metric("wall_ms", wall_s * 1e3);
    if (host.mismatched_launches) b.metric("first_bad_launch", (double)host.first_bad_launch);
    b.metric("variant", p.variant);
    b.metrics_.value("resolved", p.values);  // every parameter as run: enough to replay
    json::Writer w;
    w.str("status", "ok")
        .num("launches", (double)launches)
        .num("mismatched", (double)host.mismatched_launches)
        .num("bad_elements", (double)host.bad_elements)
        .num("max_rel_err", max_rel)
        .num("kernel_ms", kernel_ms)
        .num("seed", (double)seed)
        .raw("metrics", b.metrics_.done());
    last_mismatched_ = host.mismatched_launches;
    return w.done();
  }
  unsigned long long last_mismatched() const { return last_mismatched_; }

 private:
  void ensure_bits(long launches) {
    size_t words = (size_t)(launches + 31) / 32;
    if (words <= bits_words_) return;
    if (bits_) HZ_CHECK(cudaFree(bits_));
    HZ_CHECK(cudaMalloc(&bits_, words * sizeof(unsigned)));
    bits_words_ = words;
  }
  const FamilyTable& table_;
  const FamilySpec& fam_;
  Device dev_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ev_[2] = {nullptr, nullptr};
  cudaEvent_t pace_[kQueueDepth] = {};
  DeviceCheck* check_ = nullptr;
  unsigned* bits_ = nullptr;
  size_t bits_words_ = 0;
  unsigned long long last_mismatched_ = 0;
  std::mt19937_64 rng_;
};

int main_entry(int argc, char** argv, const FamilySpec& spec);

}  // namespace hz

#include "harness_main.h"

// Ends a family source: `HZ_FAMILY_MAIN(my_family_spec)` where my_family_spec() returns a
// hz::FamilySpec (behaviour only; the table comes from hz_family_table.h).
#define HZ_FAMILY_MAIN(spec_fn)                          \
  int main(int argc, char** argv) {                      \
    static const ::hz::FamilySpec spec = spec_fn();      \
    return ::hz::main_entry(argc, argv, spec);           \
  }
