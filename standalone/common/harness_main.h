// harness_main.h -- the command-line modes of a family binary (--list, --once, --serve,
// --raw-loop). Included by harness.h; a family never includes it directly.
#pragma once

#include <algorithm>
#include <cstring>
#include <iostream>
#include <string>

namespace hz {
namespace detail {

inline void emit(const std::string& line) {
  std::fputs(line.c_str(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

inline std::string error_reply(const char* status, const std::string& message) {
  return json::Writer().str("status", status).str("message", message).done();
}

// Prefix a reply object with {"id": N, ...}.
inline std::string with_id(const json::Value* id, const std::string& reply) {
  std::string idtxt = id ? json::dump(*id) : "null";
  return "{\"id\":" + idtxt + (reply.size() > 2 ? "," + reply.substr(1) : "}");
}

// Split --once / --raw-loop input into (params, launches): a request-shaped object
// {"launches": N, "params": {...}} or a bare params object (optionally with "launches").
inline void split_request(const json::Value& req, json::Value& params, long& launches) {
  if (req.type != json::Value::Object) throw BadRequest("request must be a JSON object");
  const json::Value* inner = req.get("params");
  const json::Value* n = req.get("launches");
  if (n) {
    if (!n->is_integer()) throw BadRequest("launches must be an integer");
    launches = (long)n->num;
  }
  if (inner) {
    params = *inner;
    return;
  }
  params = req;  // bare params: drop the harness key
  params.obj.erase(std::remove_if(params.obj.begin(), params.obj.end(),
                                  [](const std::pair<std::string, json::Value>& kv) { return kv.first == "launches"; }),
                   params.obj.end());
}

inline json::Value parse_or_throw(const std::string& text) {
  json::Value v;
  std::string err;
  if (!json::parse(text, v, err)) throw BadRequest("request is not JSON: " + err);
  return v;
}

inline int usage(const char* prog) {
  std::fprintf(stderr,
               "usage: %s --list | --once [JSON] | --serve | --raw-loop N [JSON]\n"
               "  JSON: {\"launches\": N, \"params\": {\"variant\": ..., ...}} or a bare params object;\n"
               "  --once without JSON reads the params from the env var HZ_PARAMS.\n",
               prog);
  return 2;
}

inline int run_once(const FamilySpec& spec, const std::string& text) {
  Runner r(spec);
  try {
    json::Value params;
    long launches = 1;
    const char* env_launches = std::getenv("HZ_LAUNCHES");  // set by command targets
    if (env_launches && *env_launches) launches = std::atol(env_launches);
    split_request(parse_or_throw(text), params, launches);
    resolve(spec, params);  // a bad request is answered before touching the device
    r.init_device();
    std::string reply = r.run_batch(params, launches);
    emit("HZ_RESULT " + reply);
    return r.last_mismatched() ? 1 : 0;
  } catch (const BadRequest& e) {
    emit("HZ_RESULT " + error_reply("bad_request", e.what()));
    return 2;
  } catch (const BadReference& e) {
    emit("HZ_RESULT " + error_reply("bad_reference", e.what()));
    return 2;
  } catch (const DeviceFault& e) {
    emit("HZ_RESULT " + error_reply("fault", e.what()));
    return 3;
  }
}

inline std::string variant_of(const json::Value& reply) {
  const json::Value* m = reply.get("metrics");
  const json::Value* v = m ? m->get("variant") : nullptr;
  return v ? v->str : "";
}

inline int run_raw_loop(const FamilySpec& spec, long n, const std::string& text) {
  Runner r(spec);
  try {
    json::Value params;
    long ignored = 0;
    split_request(parse_or_throw(text), params, ignored);
    r.init_device();
    double wall_s = 0;
    r.run_batch(params, n < 50 ? n : 50, false);  // warm-up: module load, first allocation
    std::string reply = r.run_batch(params, n, false, &wall_s);
    json::Value rv = parse_or_throw(reply);
    double kernel_ms = rv.get("kernel_ms") ? rv.get("kernel_ms")->num : 0.0;
    emit("HZ_RAW " + json::Writer()
                         .num("launches", (double)n)
                         .num("loop_ms", kernel_ms)
                         .num("launches_per_s", kernel_ms > 0 ? n / (kernel_ms * 1e-3) : 0.0)
                         .num("wall_ms", wall_s * 1e3)
                         .str("variant", variant_of(rv))
                         .done());
    return 0;
  } catch (const BadRequest& e) {
    std::fprintf(stderr, "hz: bad request: %s\n", e.what());
    return 2;
  } catch (const BadReference& e) {
    std::fprintf(stderr, "hz: bad reference: %s\n", e.what());
    return 2;
  } catch (const DeviceFault& e) {
    std::fprintf(stderr, "hz: device fault: %s\n", e.what());
    return 3;
  }
}

inline int run_serve(const FamilySpec& spec) {
  Runner r(spec);
  try {
    r.init_device();
  } catch (const DeviceFault& e) {
    std::fprintf(stderr, "hz: device init failed: %s\n", e.what());
    return 3;
  }
  std::vector<std::string> names;
  for (const auto& v : spec.variants) names.push_back(v.name);
  emit(json::Writer()
           .num("hz_protocol", kProtocolVersion)
           .str("server", spec.name)
           .num("pid", (double)getpid())
           .str("device", r.device().prop.name)
           .str("gpu_uuid", r.device().uuid)
           .num("sm_count", r.device().prop.multiProcessorCount)
           .strings("variants", names)
           .done());
  std::string line;
  while (std::getline(std::cin, line)) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    json::Value req;
    std::string err;
    if (!json::parse(line, req, err) || req.type != json::Value::Object) {
      emit(with_id(nullptr, error_reply("bad_request", "request is not a JSON object: " + err)));
      continue;
    }
    const json::Value* id = req.get("id");
    const json::Value* cmd = req.get("cmd");
    if (cmd && cmd->type == json::Value::String && cmd->str == "quit") return 0;
    try {
      if (!id || !id->is_integer()) throw BadRequest("request needs an integer id");
      if (cmd) throw BadRequest("unknown cmd");
      json::Value params;
      params.type = json::Value::Object;
      long launches = 1;
      split_request(req, params, launches);
      emit(with_id(id, r.run_batch(params, launches)));
    } catch (const BadRequest& e) {
      emit(with_id(id, error_reply("bad_request", e.what())));
    } catch (const BadReference& e) {
      emit(with_id(id, error_reply("bad_reference", e.what())));
    } catch (const DeviceFault& e) {
      emit(with_id(id, error_reply("fault", e.what())));
      return 3;  // the context may be poisoned: the supervisor respawns us
    }
  }
  return 0;  // EOF
}

}  // namespace detail

inline int main_entry(int argc, char** argv, const FamilySpec& spec) {
  if (argc < 2) return detail::usage(argv[0]);
  std::string mode = argv[1];
  if (mode == "--list") {
    detail::emit(detail::list_json(spec));
    return 0;
  }
  if (mode == "--once") {
    std::string text;
    if (argc >= 3) {
      text = argv[2];
    } else {
      const char* env = std::getenv("HZ_PARAMS");
      text = env && *env ? env : "{}";
    }
    return detail::run_once(spec, text);
  }
  if (mode == "--serve") return detail::run_serve(spec);
  if (mode == "--raw-loop" && argc >= 3) {
    long n = std::atol(argv[2]);
    if (n < 1) return detail::usage(argv[0]);
    return detail::run_raw_loop(spec, n, argc >= 4 ? argv[3] : "{}");
  }
  return detail::usage(argv[0]);
}

}  // namespace hz
