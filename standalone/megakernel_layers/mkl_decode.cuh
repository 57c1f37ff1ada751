// mkl_decode.cuh -- `--decode REQUEST`: the layered megakernel decodes a model whose weights
// come from a file (a trained model, not the hash), one launch per token, teacher-forced, and
// writes the final hidden state of every position. The logit gate's kernel path
// (hazards/gates/synthlm/megakernel.py) runs the embedding before it and the final RMSNorm +
// LM head after it in torch; everything between is this binary's kernel, the hazard switch as
// requested. Included by megakernel_layers.cu after its anonymous namespace: it uses that
// file's Setup, Scratch, make_params, launch_step, pack_row and tripwire, so the kernel, the
// launch and the host packer are the ones every other mode runs.
//
// Request (one JSON object on the command line):
//   {"weights": PATH, "inputs": PATH, "out": PATH, "shape": [D, NQ, NKV, E, K, I], "layers": L,
//    "sequences": S, "positions": T, "grid": 0, "chunks": 8, "hazard": "none",
//    "jitter_ppm": 0, "jitter_cycles": 0, "writeback_ppm": 1000000, "gemv_depth": 4,
//    "tripwire": "on", "seed": 1}
// weights: per layer, packed without gaps: attn_norm f32 (D), mlp_norm f32 (D), Wqkv bf16
//   (qkv_rows x D: q heads, then k, then v), Wo bf16 (D x NQ*HD), router bf16 (E x D), W13 bf16
//   (E x 2I x D, rows 2c gate and 2c + 1 up of channel c), W2 bf16 (E x D x I).
// inputs: S x T x D f32, the embedding of every position's token (packed as the production
//   packer packs x_in: dead_flag makes each row bf16 pairs read as fp32).
// out: S x T x D f32, written: the residual stream after the last layer of each step.
// Position t of a sequence is decode step t: it attends over the K/V rows 0..t that the same
// sequence's steps wrote (row t by this step). The chunk count is fixed for the whole run
// (a chunk past the tokens is empty): every barrier's expected value derives from (step,
// layer) with constant arrivals per step, and the step index runs on across sequences.
// Reply: one `MKL_DECODE {json}` line on stdout; exit 0 ok, 2 bad request, 3 device fault.
#pragma once

namespace mkl_decode {

using namespace mkl;

// The attention head groupings attend_chunk<GQ, NKV> is instantiated for (its dispatch in
// mkl_kernel.cuh); any other traps on the device, so it is refused here first.
inline bool attention_compiled(const Shape& s) {
  return (s.NKV == 8 && s.NQ == 64) || (s.NKV == 4 && s.NQ == 16);
}

// Bytes of one layer in the weights file (the order in the header comment).
inline size_t layer_bytes(const Shape& s) {
  return (size_t)2 * s.D * 4 +
         2 * ((size_t)qkv_rows(s) * s.D + (size_t)s.D * s.NQ * HD + (size_t)s.E * s.D + (size_t)s.E * 2 * s.I * s.D +
              (size_t)s.E * s.D * s.I);
}

inline std::vector<char> read_file(const std::string& path, size_t want, const char* what) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  if (!f) throw hz::BadRequest(std::string("cannot read the ") + what + " file " + path);
  const size_t got = (size_t)f.tellg();
  if (got != want)
    throw hz::BadRequest(std::string("the ") + what + " file " + path + " has " + std::to_string(got) +
                         " bytes; the request's shape needs " + std::to_string(want));
  std::vector<char> buf(want);
  f.seekg(0);
  f.read(buf.data(), (std::streamsize)want);
  if (!f) throw hz::BadRequest(std::string("cannot read the ") + what + " file " + path);
  return buf;
}

inline const hz::json::Value& need(const hz::json::Value& req, const char* key, hz::json::Value::Type type) {
  const hz::json::Value* v = req.get(key);
  if (!v || v->type != type) throw hz::BadRequest(std::string("decode request needs \"") + key + "\" (" +
                                                  (type == hz::json::Value::String ? "a path" : "an array") + ")");
  return *v;
}

inline long long int_field(const hz::json::Value& req, const char* key, long long dflt, long long lo, long long hi) {
  const hz::json::Value* v = req.get(key);
  if (!v && dflt < lo) throw hz::BadRequest(std::string("decode request needs \"") + key + "\"");
  if (!v) return dflt;
  if (!v->is_integer() || v->num < (double)lo || v->num > (double)hi)
    throw hz::BadRequest(std::string("decode request: \"") + key + "\" must be an integer in [" + std::to_string(lo) +
                         ", " + std::to_string(hi) + "]");
  return (long long)v->num;
}

inline std::string str_field(const hz::json::Value& req, const char* key, const char* dflt) {
  const hz::json::Value* v = req.get(key);
  if (!v) return dflt;
  if (v->type != hz::json::Value::String) throw hz::BadRequest(std::string("decode request: \"") + key + "\" must be a string");
  return v->str;
}

// Validate the shape against what the kernel is built for; a clear BadRequest otherwise.
inline Shape request_shape(const hz::json::Value& req) {
  const hz::json::Value& a = need(req, "shape", hz::json::Value::Array);
  if (a.arr.size() != 6) throw hz::BadRequest("decode request: \"shape\" is [D, NQ, NKV, E, K, I]");
  int v[6];
  for (int i = 0; i < 6; ++i) {
    if (!a.arr[i].is_integer() || a.arr[i].num < 1 || a.arr[i].num > 65536)
      throw hz::BadRequest("decode request: every \"shape\" entry must be an integer in [1, 65536]");
    v[i] = (int)a.arr[i].num;
  }
  const Shape s{v[0], v[1], v[2], v[3], v[4], v[5]};
  if (!attention_compiled(s))
    throw hz::BadRequest("the kernel's attention is compiled for 64 q / 8 kv and 16 q / 4 kv heads of " +
                         std::to_string(HD) + ", not " + std::to_string(s.NQ) + " / " + std::to_string(s.NKV));
  if (s.D % 8 != 0) throw hz::BadRequest("D must be a multiple of 8 (16-B weight rows), got " + std::to_string(s.D));
  if (s.I % SUB_BLOCK != 0)
    throw hz::BadRequest("I must be a multiple of " + std::to_string(SUB_BLOCK) + " (the FP8 sub-block), got " +
                         std::to_string(s.I));
  if (s.E > 64 || s.K > 16 || s.K > s.E)
    throw hz::BadRequest("experts must be <= 64 and top-k <= min(16, experts), got " + std::to_string(s.E) + " / " +
                         std::to_string(s.K));
  return s;
}

inline int run_decode(const std::string& text) {
  try {
    hz::json::Value req;
    std::string err;
    if (!hz::json::parse(text, req, err) || req.type != hz::json::Value::Object)
      throw hz::BadRequest("decode request is not a JSON object: " + err);
    Setup u;
    u.s = request_shape(req);
    const Shape& s = u.s;
    u.L = (int)int_field(req, "layers", -1, 1, 64);
    const long long nseq = int_field(req, "sequences", -1, 1, 1 << 20);
    const int T = (int)int_field(req, "positions", -1, 1, 1 << 16);
    u.hazard = hazard_id(str_field(req, "hazard", "none"));
    u.jitter_ppm = (int)int_field(req, "jitter_ppm", 0, 0, 1000000);
    u.jitter_cycles = int_field(req, "jitter_cycles", 0, 0, 100000000);
    u.writeback_ppm = (int)int_field(req, "writeback_ppm", 1000000, 0, 1000000);
    u.gemv_depth = (int)int_field(req, "gemv_depth", 4, 1, 4);
    const std::string tw = str_field(req, "tripwire", "on");
    if (tw != "on" && tw != "off") throw hz::BadRequest("decode request: \"tripwire\" is on or off");
    u.tripwire = tw == "on";
    const uint64_t seed = (uint64_t)int_field(req, "seed", 1, 0, 1LL << 40);
    const std::string wpath = need(req, "weights", hz::json::Value::String).str;
    const std::string ipath = need(req, "inputs", hz::json::Value::String).str;
    const std::string opath = need(req, "out", hz::json::Value::String).str;
    const size_t positions = (size_t)nseq * T;
    const std::vector<char> wfile = read_file(wpath, layer_bytes(s) * u.L, "weights");
    const std::vector<char> ifile = read_file(ipath, positions * s.D * sizeof(float), "inputs");

    hz::Device d;
    HZ_CHECK(cudaSetDevice(0));
    HZ_CHECK(cudaGetDeviceProperties(&d.prop, 0));
    if (smem_bytes(s) > d.prop.sharedMemPerBlockOptin)
      throw hz::BadRequest("shape needs " + std::to_string(smem_bytes(s)) + " B of shared memory per block");
    const int limit = resident_limit(d, s);
    const long long grid = int_field(req, "grid", 0, 0, 4096);
    u.G = grid > 0 ? (int)grid : d.prop.multiProcessorCount;
    if (u.G > limit) throw hz::BadRequest("grid " + std::to_string(u.G) + " above the co-residency limit " + std::to_string(limit));
    u.C = (int)int_field(req, "chunks", std::min(8, u.G), 1, 4096);
    if (u.C > u.G && u.hazard != HZ_CHUNK_SUPPLY)
      throw hz::BadRequest("chunks " + std::to_string(u.C) + " > workers " + std::to_string(u.G) + ": rejected");
    u.QT = qkv_tiles(s);
    u.T13 = w13_tiles(u.G, s.K);
    u.n_rows = row_workers(u.G, s.D);
    u.seq = T - 1;  // the cache holds T rows
    u.S = T;
    cudaStream_t st;
    HZ_CHECK(cudaStreamCreate(&st));

    // the weights, one allocation per tensor (cudaMalloc's alignment; every row is 16 B)
    std::vector<void*> owned;
    auto upload = [&](const char*& src, size_t bytes) {
      void* dst = dalloc<char>(bytes);
      owned.push_back(dst);
      HZ_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
      src += bytes;
      return (unsigned long long)dst;
    };
    const size_t cache_l = (size_t)T * s.NKV * HD;
    std::vector<unsigned long long> table((size_t)u.L * N_SLOTS);
    const char* src = wfile.data();
    for (int l = 0; l < u.L; ++l) {
      unsigned long long* row = table.data() + (size_t)l * N_SLOTS;
      row[SLOT_ATTN_NORM] = upload(src, (size_t)s.D * 4);
      row[SLOT_MLP_NORM] = upload(src, (size_t)s.D * 4);
      row[SLOT_WQKV] = upload(src, (size_t)qkv_rows(s) * s.D * 2);
      row[SLOT_WO] = upload(src, (size_t)s.D * s.NQ * HD * 2);
      row[SLOT_ROUTER] = upload(src, (size_t)s.E * s.D * 2);
      row[SLOT_W13] = upload(src, (size_t)s.E * 2 * s.I * s.D * 2);
      row[SLOT_W2] = upload(src, (size_t)s.E * s.D * s.I * 2);
      for (int slot : {SLOT_KCACHE, SLOT_VCACHE}) {
        __nv_bfloat16* c = dalloc<__nv_bfloat16>(cache_l);
        owned.push_back(c);
        HZ_CHECK(cudaMemset(c, 0, cache_l * 2));
        row[slot] = (unsigned long long)c;
      }
    }
    Model m;  // only its descriptor table is read by make_params (never released: `owned` is)
    m.table = dalloc<unsigned long long>(table.size());
    owned.push_back(m.table);
    HZ_CHECK(cudaMemcpy(m.table, table.data(), table.size() * sizeof(unsigned long long), cudaMemcpyHostToDevice));

    // every position's input, packed as the production packer packs x_in; one output row each
    std::vector<float> packed(positions * s.D);
    const float* in = reinterpret_cast<const float*>(ifile.data());
    for (size_t r = 0; r < positions; ++r) pack_row(in + r * s.D, s.D, u.hazard == HZ_DEAD_FLAG, packed.data() + r * s.D);
    float* d_in = dalloc<float>(packed.size());
    float* d_out = dalloc<float>(packed.size());
    owned.push_back(d_in);
    owned.push_back(d_out);
    HZ_CHECK(cudaMemcpy(d_in, packed.data(), packed.size() * sizeof(float), cudaMemcpyHostToDevice));

    ensure_scratch(u);
    HZ_CHECK(cudaMemsetAsync(g_scratch.sync, 0, (size_t)sync_bytes(s.E), st));  // counters start at 0
    Params p = make_params(u, m);
    cudaEvent_t ev[2];
    HZ_CHECK(cudaEventCreate(&ev[0]));
    HZ_CHECK(cudaEventCreate(&ev[1]));
    HZ_CHECK(cudaEventRecord(ev[0], st));
    long step = 0;
    for (long long q = 0; q < nseq; ++q) {
      for (int t = 0; t < T; ++t, ++step) {
        p.seq = t;
        p.S = t + 1;
        p.step = (int)step;
        p.seed = hz::splitmix64(seed + (uint64_t)step);
        p.x_in = d_in + (size_t)step * s.D;
        p.xres = d_out + (size_t)step * s.D;
        HZ_CHECK(launch_step(p, u.tripwire, u.tripwire ? g_tripwire.launch((uint32_t)u.G) : hz_tw_t{}, st));
      }
      HZ_CHECK(cudaStreamSynchronize(st));  // a fault names its sequence; the queue stays short
    }
    HZ_CHECK(cudaEventRecord(ev[1], st));
    HZ_CHECK(cudaEventSynchronize(ev[1]));
    float ms = 0.f;
    HZ_CHECK(cudaEventElapsedTime(&ms, ev[0], ev[1]));
    std::vector<float> out(packed.size());
    HZ_CHECK(cudaMemcpy(out.data(), d_out, out.size() * sizeof(float), cudaMemcpyDeviceToHost));
    for (void* ptr : owned) HZ_CHECK(cudaFree(ptr));
    std::ofstream f(opath, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(out.data()), (std::streamsize)(out.size() * sizeof(float)));
    f.close();
    if (!f) throw hz::BadRequest("cannot write " + opath);
    hz::json::Writer w;
    w.str("status", "ok").num("launches", (double)step).num("seconds", ms * 1e-3)
        .num("us_per_launch", ms * 1e3 / (double)std::max<long>(1, step)).num("grid", u.G).num("chunks", u.C)
        .num("qkv_tiles", u.QT).num("w13_tiles", u.T13).num("layers", u.L).str("hazard", kHazardNames[u.hazard])
        .num("jitter_ppm", u.jitter_ppm).num("jitter_cycles", (double)u.jitter_cycles).num("gemv_depth", u.gemv_depth)
        .str("tripwire", u.tripwire ? g_tripwire.mode_name() : "compiled-out instance").str("device", d.prop.name);
    hz::detail::emit("MKL_DECODE " + w.done());
    return 0;
  } catch (const hz::BadRequest& e) {
    hz::detail::emit(std::string("MKL_DECODE ") + hz::detail::error_reply("bad_request", e.what()));
    return 2;
  } catch (const hz::DeviceFault& e) {
    hz::detail::emit(std::string("MKL_DECODE ") + hz::detail::error_reply("fault", e.what()));
    return 3;
  } catch (const std::logic_error& e) {
    hz::detail::emit(std::string("MKL_DECODE ") + hz::detail::error_reply("bad_request", e.what()));
    return 2;
  }
}

}  // namespace mkl_decode
