// pybind11 bindings: the private module `server._engine`, re-exported by `server.engine`.
// Every call that may take time (loading, closing, submitting) releases the GIL; the
// engine's own thread never holds it.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>

#include "engine/engine.h"
#include "engine/model_facts.h"
#include "engine/scheduler.h"
#include "engine/event_wire.h"
#include "engine/frame_sink.h"
#include "engine/text_stream.h"
#include "splice.h"

namespace py = pybind11;

namespace {

py::object logprobs_to_python(const std::vector<logprob_entry> & entries) {
    if (entries.empty()) {
        return py::none();
    }
    py::list out;
    for (const logprob_entry & e : entries) {
        py::list top;
        for (const token_logprob & t : e.top) {
            top.append(py::make_tuple(t.token, t.logprob, py::bytes(t.piece)));
        }
        out.append(py::make_tuple(e.chosen.token, e.chosen.logprob, py::bytes(e.chosen.piece), top));
    }
    return out;
}

py::object embedding_to_python(const std::vector<float> & embedding) {
    if (embedding.empty()) {
        return py::none();
    }
    return py::array_t<float>((py::ssize_t) embedding.size(), embedding.data());
}

// Counter names and help, as the C++ list has them (see engine/counters.h).
py::list counters_to_python() {
    py::list out;
#define COUNTER_ENTRY(field, name, labels, help) out.append(py::make_tuple(#field, name, labels, help));
    ENGINE_COUNTERS(COUNTER_ENTRY)
#undef COUNTER_ENTRY
    return out;
}

py::dict stats_to_python(const engine_stats & s) {
    py::dict d;
#define COUNTER_VALUE(field, name, labels, help) d[#field] = s.field;
    ENGINE_COUNTERS(COUNTER_VALUE)
#undef COUNTER_VALUE
    return d;
}

token_logprob token_logprob_from_python(const py::handle & obj) {
    const py::sequence t = obj.cast<py::sequence>();
    return {t[0].cast<int32_t>(), t[1].cast<float>(), t[2].cast<std::string>()};
}

// The shape logprobs_to_python() gives, back (an event that crossed a process boundary).
std::vector<logprob_entry> logprobs_from_python(const py::object & obj) {
    std::vector<logprob_entry> out;
    if (obj.is_none()) {
        return out;
    }
    for (const py::handle entry : obj) {
        const py::sequence e = entry.cast<py::sequence>();
        logprob_entry le{token_logprob_from_python(e), {}};
        for (const py::handle alt : e[3]) {
            le.top.push_back(token_logprob_from_python(alt));
        }
        out.push_back(std::move(le));
    }
    return out;
}

py::object timings_to_python(const request_timings & t) {
    if (!t.known) {
        return py::none();
    }
    return py::cast(t);
}

py::list histograms_meta() {
    py::list out;
#define HISTOGRAM_ENTRY(field, name, divisor, help) out.append(py::make_tuple(#field, name, help));
    ENGINE_HISTOGRAMS(HISTOGRAM_ENTRY)
#undef HISTOGRAM_ENTRY
    return out;
}

py::list gauges_meta() {
    py::list out;
#define GAUGE_ENTRY(field, name, help) out.append(py::make_tuple(#field, name, help));
    ENGINE_GAUGES(GAUGE_ENTRY)
#undef GAUGE_ENTRY
    return out;
}

// (bounds in Prometheus units, counts per bucket with the last above every bound, sum)
py::tuple histogram_to_python(const histogram & h, double divisor) {
    py::list bounds, counts;
    for (size_t i = 0; i < h.n_bounds(); ++i) {
        bounds.append((double) h.bounds()[i] / divisor);
    }
    for (size_t i = 0; i <= h.n_bounds(); ++i) {
        counts.append(h.count_at(i));
    }
    return py::make_tuple(bounds, counts, (double) h.sum() / divisor);
}

py::dict metrics_to_python(engine_observer & obs) {
    py::dict histograms, gauges;
    const engine_histograms & h = obs.histograms();
    const engine_gauges & g = obs.gauges();
#define HISTOGRAM_VALUE(field, name, divisor, help) histograms[#field] = histogram_to_python(h.field, divisor);
    ENGINE_HISTOGRAMS(HISTOGRAM_VALUE)
#undef HISTOGRAM_VALUE
#define GAUGE_VALUE(field, name, help) gauges[#field] = g.field.load(std::memory_order_relaxed);
    ENGINE_GAUGES(GAUGE_VALUE)
#undef GAUGE_VALUE
    py::dict out;
    out["histograms"] = histograms;
    out["gauges"] = gauges;
    return out;
}

py::dict trace_record_to_python(const trace_record & r) {
    static const char * const kinds[] = {"step", "prefill", "request"};
    py::dict d;
    d["kind"] = kinds[r.kind];
    d["t_begin_us"] = r.t_begin_us;
    d["t_end_us"] = r.t_end_us;
    if (r.kind == TRACE_STEP) {
        static const char * const phases[] = {"schedule", "batch", "decode", "sample", "emit"};
        py::dict phase_us;
        for (int p = 0; p < N_PHASES; ++p) {
            phase_us[phases[p]] = r.d_us[p];
        }
        d["phase_us"] = phase_us;
        d["n_items"] = r.n_items;
        d["n_tokens"] = r.n_tokens;
        d["n_sampled"] = r.n_sampled;
        return d;
    }
    d["id_request"] = r.id_request;
    d["n_tokens"] = r.n_tokens;
    if (r.kind == TRACE_REQUEST) {
        d["status"] = (int) r.status;
        d["t_admit_us"] = r.t_admit_us;
        d["t_first_us"] = r.t_first_us;
        d["t_last_us"] = r.t_last_us;
        d["n_prompt"] = r.n_prompt;
        d["n_cached"] = r.n_cached;
    }
    return d;
}

struct stopped_trace {
    std::vector<trace_record> records;
    size_t next = 0;  // records before it were taken
};

// An event made on the Python side: a request ended by the runner itself, an event that
// crossed from a worker process, a test's fake.
engine_event make_event(int64_t id_request, int status, const std::string & text, int32_t n_tokens,
                        int32_t n_prompt, int32_t n_cached, int32_t n_generated, const std::string & error,
                        const py::object & logprobs, const py::object & embedding, const py::object & timings,
                        const std::string & stop, const py::object & prompt_logprobs) {
    if (status < REQUEST_STATUS_WAITING || status > REQUEST_STATUS_FINISHED_ERROR) {
        throw std::invalid_argument("unknown request status");
    }
    engine_event ev{.id_request = id_request, .text = text, .n_tokens = n_tokens,
                    .status = (request_status) status, .n_prompt = n_prompt, .n_cached = n_cached,
                    .n_generated = n_generated, .logprobs = logprobs_from_python(logprobs),
                    .prompt_logprobs = logprobs_from_python(prompt_logprobs),
                    .embedding = {}, .error = error, .stop = stop, .timings = {}};
    if (!embedding.is_none()) {
        const auto array = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(embedding);
        if (!array) {
            throw std::invalid_argument("embedding must be an array of floats");
        }
        ev.embedding.assign(array.data(), array.data() + array.size());
    }
    if (!timings.is_none()) {
        ev.timings = timings.cast<request_timings>();
    }
    return ev;
}

py::dict plan_to_python(const batch_plan & plan) {
    py::list admissions, items;
    for (const plan_admission & a : plan.admissions) {
        admissions.append(py::make_tuple(a.id_request, a.id_slot, a.n_keep));
    }
    for (const plan_item & i : plan.items) {
        items.append(py::make_tuple(i.id_request, i.id_slot, i.pos0, i.n_tokens, i.is_prompt, i.want_logits));
    }
    py::dict out;
    out["admissions"] = admissions;
    out["items"] = items;
    out["released"] = plan.released;
    out["released_waiting"] = plan.released_waiting;
    out["preempted"] = plan.preempted;
    out["n_tokens"] = plan.n_tokens;
    return out;
}

// A worker engine's sink (Engine.attach_sink first): the Python side's frames go through it too.
// The engine sees only its event_sink; the one this module attaches is always a frame_sink.
frame_sink & sink_of(engine & e) {
    auto * sink = dynamic_cast<frame_sink *>(e.sink());
    if (sink == nullptr) {
        throw std::logic_error("no sink attached (Engine.attach_sink)");
    }
    return *sink;
}

// The scheduling policy alone, for tests with a fake decoder.
class py_scheduler {
public:
    py_scheduler(int32_t n_slots, int32_t n_batch, int32_t n_ctx_seq, int32_t n_max_waiting,
                 int32_t n_max_slots_per_owner, bool share_time)
        : sched_(scheduler_params{n_slots, n_batch, n_ctx_seq, n_max_waiting, n_max_slots_per_owner, share_time}) {}

    bool enqueue(int64_t id, std::vector<int32_t> prompt, int32_t max_tokens, int64_t owner) {
        auto req = std::make_unique<sched_request>();
        req->id_request = id;
        req->id_owner = owner;
        req->prompt = std::move(prompt);
        req->limits.n_max_tokens = max_tokens;
        return sched_.enqueue(std::move(req));
    }
    bool cancel(int64_t id) { return sched_.cancel(id); }
    py::dict schedule() {
        last_ = sched_.schedule();
        return plan_to_python(last_);
    }
    std::vector<int64_t> apply(const std::vector<std::tuple<int64_t, int32_t, int>> & outcomes) {
        std::vector<step_outcome> out;
        for (const auto & [id, token, status] : outcomes) {
            out.push_back({id, token, (request_status) status});
        }
        return sched_.apply(last_, out);
    }
    void charge(int64_t decode_us, const std::vector<int64_t> & sample_us) {
        sched_.charge(last_, decode_us, sample_us);
    }
    std::vector<int32_t> slot_cache(int32_t id_slot) const { return sched_.slot(id_slot).cache; }
    py::object request(int64_t id) {
        const sched_request * r = sched_.find(id);
        if (r == nullptr) {
            return py::none();
        }
        py::dict d;
        d["status"] = (int) r->status;
        d["slot"] = r->id_slot;
        d["n_cached"] = r->n_cached;
        d["n_prompt_done"] = r->n_prompt_done;
        d["n_generated"] = r->n_generated;
        return d;
    }
    void release(int64_t id) { sched_.release(id); }
    void fail(int64_t id) { sched_.fail(id); }
    void set_active_slots(int32_t n) { sched_.set_active_slots(n); }
    int32_t n_waiting() const { return sched_.n_waiting(); }
    int32_t n_running() const { return sched_.n_running(); }

private:
    scheduler sched_;
    batch_plan last_;
};

}  // namespace

PYBIND11_MODULE(_engine, m) {
    m.doc() = "stackd's native engine: continuous batching on llama.cpp";

    py::list reasons;
    for (int s = REQUEST_STATUS_WAITING; s <= REQUEST_STATUS_FINISHED_ERROR; ++s) {
        const char * reason = request_status_finish_reason((request_status) s);
        reasons.append(reason ? py::object(py::str(reason)) : py::object(py::none()));
    }
    m.attr("FINISH_REASONS") = reasons;
    m.attr("STATUS_RUNNING") = (int) REQUEST_STATUS_RUNNING;
    m.attr("STATUS_STOPPED") = (int) REQUEST_STATUS_FINISHED_STOPPED;
    m.attr("STATUS_LENGTH") = (int) REQUEST_STATUS_FINISHED_LENGTH;
    m.attr("STATUS_ABORTED") = (int) REQUEST_STATUS_FINISHED_ABORTED;
    m.attr("STATUS_ERROR") = (int) REQUEST_STATUS_FINISHED_ERROR;
    m.attr("SUBMIT_ACCEPTED") = (int) SUBMIT_ACCEPTED;
    m.attr("SUBMIT_QUEUE_FULL") = (int) SUBMIT_QUEUE_FULL;
    m.attr("SUBMIT_OVER_SHARE") = (int) SUBMIT_OVER_SHARE;
    m.attr("SPLIT_MODE_LAYER") = (int) LLAMA_SPLIT_MODE_LAYER;
    m.attr("SPLIT_MODE_TENSOR") = (int) LLAMA_SPLIT_MODE_TENSOR;
    m.def("rpc_serve", &rpc_serve, py::call_guard<py::gil_scoped_release>(), py::arg("endpoint"),
          py::arg("cache_dir"), py::arg("n_threads"), py::arg("device") = 0,
          "Serve a device (its address; 0: this CPU) to ggml RPC clients on endpoint (127.0.0.1:port); "
          "never returns.");
    m.def("splice",
          [](int a, int b) {
              unsigned long long counts[2];
              int first;
              {
                  py::gil_scoped_release release;
                  first = splice_sockets(a, b, counts);
              }
              return py::make_tuple(first, counts[0], counts[1]);
          },
          py::arg("a"), py::arg("b"),
          "Copy bytes both ways between two connected sockets (fds) until either side ends, off the GIL; "
          "then shut both down. Returns (0 if a -> b ended first else 1, bytes a -> b, bytes b -> a).");

    py::class_<sampling_params> sampling(m, "SamplingParams");
    sampling.def(py::init<>());
#define STACKD_SAMPLING_BINDING(type, name, init) sampling.def_readwrite(#name, &sampling_params::name);
    STACKD_SAMPLING_FIELDS(STACKD_SAMPLING_BINDING)
#undef STACKD_SAMPLING_BINDING
    m.attr("COUNTERS") = counters_to_python();
    m.attr("HISTOGRAMS") = histograms_meta();
    m.attr("GAUGES") = gauges_meta();

    // A finished request's durations on the engine's clock (microseconds).
    py::class_<request_timings>(m, "Timings")
        .def(py::init([](int64_t queue, int64_t prompt, int64_t first_token, int64_t predicted,
                         int64_t drafted, int64_t draft_accepted) {
                 return request_timings{true, queue, prompt, first_token, predicted, drafted, draft_accepted};
             }),
             py::kw_only(), py::arg("t_queue_us"), py::arg("t_prompt_us"), py::arg("t_first_token_us"),
             py::arg("t_predicted_us"), py::arg("n_drafted") = 0, py::arg("n_draft_accepted") = 0)
        .def_readonly("t_queue_us", &request_timings::t_queue_us)
        .def_readonly("t_prompt_us", &request_timings::t_prompt_us)
        .def_readonly("t_first_token_us", &request_timings::t_first_token_us)
        .def_readonly("t_predicted_us", &request_timings::t_predicted_us)
        .def_readonly("n_drafted", &request_timings::n_drafted)
        .def_readonly("n_draft_accepted", &request_timings::n_draft_accepted);

    // What the engine reports about a request after a step; the finishing event has a
    // finished status (and `error` when that status is FINISHED_ERROR).
    py::class_<engine_event>(m, "Event")
        .def(py::init(&make_event), py::kw_only(), py::arg("id_request"),
             py::arg("status") = (int) REQUEST_STATUS_RUNNING, py::arg("text") = std::string(),
             py::arg("n_tokens") = 0, py::arg("n_prompt") = 0, py::arg("n_cached") = 0,
             py::arg("n_generated") = 0, py::arg("error") = std::string(), py::arg("logprobs") = py::none(),
             py::arg("embedding") = py::none(), py::arg("timings") = py::none(), py::arg("stop") = std::string(),
             py::arg("prompt_logprobs") = py::none())
        .def_readonly("id_request", &engine_event::id_request)
        .def_property_readonly("text", [](const engine_event & e) { return py::bytes(e.text); })
        .def_readonly("n_tokens", &engine_event::n_tokens)
        .def_property_readonly("status", [](const engine_event & e) { return (int) e.status; })
        .def_readonly("n_prompt", &engine_event::n_prompt)
        .def_readonly("n_cached", &engine_event::n_cached)
        .def_readonly("n_generated", &engine_event::n_generated)
        .def_property_readonly("logprobs", [](const engine_event & e) { return logprobs_to_python(e.logprobs); })
        // the first sampled event of a request that asked for them: each prompt token's but the first
        .def_property_readonly("prompt_logprobs", [](const engine_event & e) { return logprobs_to_python(e.prompt_logprobs); })
        .def_property_readonly("embedding", [](const engine_event & e) { return embedding_to_python(e.embedding); })
        .def_property_readonly("error", [](const engine_event & e) {
            return e.error.empty() ? py::object(py::none()) : py::object(py::str(e.error));
        })
        .def_property_readonly("timings", [](const engine_event & e) { return timings_to_python(e.timings); })
        // the finishing event's stop string that ended the text, or None
        .def_property_readonly("stop", [](const engine_event & e) {
            // bytes from a worker's wire: decoded leniently, as the text is
            return e.stop.empty() ? py::object(py::none())
                                  : py::object(py::reinterpret_steal<py::str>(
                                        PyUnicode_DecodeUTF8(e.stop.data(), (Py_ssize_t) e.stop.size(), "replace")));
        })
        .def("__repr__", [](const engine_event & e) {
            return "<Event request " + std::to_string(e.id_request) + " status " +
                   std::to_string((int) e.status) + " tokens " + std::to_string(e.n_generated) + ">";
        });


    m.def("encode_events_wire",
          [](const std::vector<engine_event> & events) {
              std::string out;
              encode_events(events, out);
              return py::bytes(out);
          },
          "Events as event_wire.h bytes (the tail of what Engine.forward_events sends).");
    m.def("decode_events_wire",
          [](const py::bytes & data) {
              const std::string_view view = data;
              std::vector<engine_event> events = decode_events(view.data(), view.size());
              py::list out(events.size());
              for (size_t i = 0; i < events.size(); ++i) {
                  out[i] = py::cast(std::move(events[i]));
              }
              return out;
          },
          "The events in event_wire.h bytes; ValueError when the bytes break the layout.");

    // A stopped recording, turned into dicts a chunk at a time: a 60 s trace is hundreds of
    // thousands of records, and building them all in one call would hold the GIL (and the
    // event loop of an inline engine) for as long.
    py::class_<stopped_trace>(m, "TraceRecords")
        .def("__len__", [](const stopped_trace & t) { return t.records.size(); })
        .def("take",
             [](stopped_trace & t, size_t n) {
                 py::list out;
                 for (; n > 0 && t.next < t.records.size(); n--, t.next++) {
                     out.append(trace_record_to_python(t.records[t.next]));
                 }
                 return out;
             },
             py::arg("n"));

    // The lockstep's control message (native/engine/lockstep.h), for tests: a dict of the
    // fields, and its check against a follower's context (ValueError with the reason).
    m.def("lockstep_encode", [](const py::dict & d) {
        control_message msg;
        msg.kind = d.contains("kind") ? d["kind"].cast<uint16_t>() : lockstep_wire::kKindStep;
        msg.index = d.contains("index") ? d["index"].cast<uint32_t>() : 0;
        msg.prev_rc = d.contains("prev_rc") ? d["prev_rc"].cast<int32_t>() : 0;
        msg.gather = d.contains("gather") ? d["gather"].cast<uint32_t>() : 0;
        if (d.contains("ops")) {
            for (const auto & t : d["ops"].cast<std::vector<std::vector<int32_t>>>()) {
                if (t.size() != 6) {
                    throw py::value_error("an op is (op, seq, seq_dst, p0, p1, delta)");
                }
                msg.ops.push_back({t[0], t[1], t[2], t[3], t[4], t[5]});
            }
        }
        if (d.contains("tokens")) msg.tokens = d["tokens"].cast<std::vector<int32_t>>();
        if (d.contains("pos")) msg.pos = d["pos"].cast<std::vector<int32_t>>();
        if (d.contains("seq")) msg.seq = d["seq"].cast<std::vector<int32_t>>();
        if (d.contains("logits")) msg.logits = d["logits"].cast<std::vector<uint8_t>>();
        return py::bytes(encode_control(msg));
    }, py::arg("message"));
    m.def("lockstep_decode", [](const py::bytes & data, int32_t n_batch, int32_t n_seq_max, int32_t n_vocab,
                                int32_t n_ctx_seq) {
        const std::string_view view = data;
        control_message msg;
        const std::string why = decode_control(view.data(), view.size(), {n_batch, n_seq_max, n_vocab, n_ctx_seq}, msg);
        if (!why.empty()) {
            throw py::value_error(why);
        }
        py::list ops;
        for (const kv_op & op : msg.ops) {
            ops.append(py::make_tuple(op.op, op.seq, op.seq_dst, op.p0, op.p1, op.delta));
        }
        py::dict out;
        out["kind"] = msg.kind; out["index"] = msg.index; out["prev_rc"] = msg.prev_rc; out["gather"] = msg.gather;
        out["ops"] = ops;
        out["tokens"] = msg.tokens; out["pos"] = msg.pos; out["seq"] = msg.seq; out["logits"] = msg.logits;
        return out;
    }, py::arg("data"), py::arg("n_batch"), py::arg("n_seq_max"), py::arg("n_vocab"), py::arg("n_ctx_seq"));
    m.def("lockstep_channel_send", [](const std::string & name, const py::bytes & data) {
        memory_channel_send(name, std::string(data));
    }, py::arg("name"), py::arg("data"), "Tests: a raw control payload into the in-process channel `name`.");
    m.def("lockstep_channel_close", &memory_channel_close, py::arg("name"),
          "Tests: the in-process channel `name` fails (a lost link).");
    m.attr("LOCKSTEP_KEEPALIVE_MS") = lockstep::kKeepaliveMs;
    m.attr("LOCKSTEP_LEADER_SILENCE_MS") = lockstep::kLeaderSilenceMs;
    m.def("lockstep_set_leader_silence", &lockstep::set_leader_silence_for_tests, py::arg("ms"),
          "Tests: the frozen-leader watchdog's bound, in ms, for engines made from now on (0: the "
          "default); the previous one. ValueError when ms < 0.");

    py::class_<engine>(m, "Engine")
        // The settings' keywords are their names in the daemon's config (engine_params).
        .def(py::init([](const std::string & model_path, bool embeddings, int32_t slots,
                         int32_t context_length, int32_t batch, int32_t threads, int32_t max_queue,
                         int32_t flash_attn, float key_share, bool quiet,
                         std::vector<std::string> rpc_endpoints, int32_t split_mode,
                         std::vector<float> tensor_split, int32_t n_gpu_layers, int32_t n_ubatch,
                         int32_t n_lanes, int32_t speculative_draft_max, int32_t speculative_step_tokens,
                         int32_t kv_type, int32_t tp_rank, int32_t tp_size, std::string tp_transport,
                         std::string prompt_cache_dir, std::string prompt_cache_root, std::string prompt_cache_key,
                         int32_t prompt_cache_min_tokens, int64_t prompt_cache_bytes,
                         int64_t prompt_cache_disk_reserve, int32_t prompt_cache_preload) {
                 // Named fields, in engine_params' order (GCC checks both).
                 const engine_params p{
                     .model_path = model_path, .embeddings = embeddings, .slots = slots,
                     .context_length = context_length, .batch = batch, .n_ubatch = n_ubatch,
                     .threads = threads, .max_queue = max_queue, .flash_attn = flash_attn, .kv_type = kv_type,
                     .key_share = key_share, .n_lanes = n_lanes,
                     .speculative_draft_max = speculative_draft_max,
                     .speculative_step_tokens = speculative_step_tokens, .quiet = quiet,
                     .placement = {std::move(rpc_endpoints), split_mode, std::move(tensor_split), n_gpu_layers},
                     .tp_rank = tp_rank, .tp_size = tp_size, .tp_transport = std::move(tp_transport),
                     .prompt_cache_dir = std::move(prompt_cache_dir), .prompt_cache_root = std::move(prompt_cache_root),
                     .prompt_cache_key = std::move(prompt_cache_key), .prompt_cache_min_tokens = prompt_cache_min_tokens,
                     .prompt_cache_bytes = prompt_cache_bytes, .prompt_cache_disk_reserve = prompt_cache_disk_reserve,
                     .prompt_cache_preload = prompt_cache_preload};
                 py::gil_scoped_release release;
                 return std::make_unique<engine>(p);
             }),
             py::arg("model_path"), py::arg("embeddings") = false, py::arg("slots") = 4,
             py::arg("context_length") = 2048, py::arg("batch") = 512, py::arg("threads") = 0,
             py::arg("max_queue") = 256, py::arg("flash_attn") = -1, py::arg("key_share") = 1.0f,
             py::arg("quiet") = true, py::arg("rpc_endpoints") = std::vector<std::string>{},
             py::arg("split_mode") = (int32_t) LLAMA_SPLIT_MODE_LAYER,
             py::arg("tensor_split") = std::vector<float>{}, py::arg("n_gpu_layers") = 0,
             py::arg("n_ubatch") = 0, py::arg("n_lanes") = 1, py::arg("speculative_draft_max") = 8,
             py::arg("speculative_step_tokens") = 16,
             py::arg("kv_type") = (int32_t) GGML_TYPE_F16, py::arg("tp_rank") = -1, py::arg("tp_size") = 0,
             py::arg("tp_transport") = std::string(), py::arg("prompt_cache_dir") = std::string(),
             py::arg("prompt_cache_root") = std::string(), py::arg("prompt_cache_key") = std::string(),
             py::arg("prompt_cache_min_tokens") = 512, py::arg("prompt_cache_bytes") = (int64_t) 0,
             py::arg("prompt_cache_disk_reserve") = (int64_t) 0, py::arg("prompt_cache_preload") = 0)
        .def("submit",
             [](engine & e, int64_t id, std::vector<int32_t> prompt, int32_t max_tokens,
                std::vector<std::string> stop, const sampling_params & sampling, int64_t owner) {
                 generation_request req{id, owner, std::move(prompt), max_tokens, std::move(stop), sampling};
                 py::gil_scoped_release release;
                 return (int) e.submit(std::move(req));
             },
             py::arg("id"), py::arg("prompt"), py::arg("max_tokens"), py::arg("stop"),
             py::arg("sampling"), py::arg("owner") = 0)
        // A request's choices, every one or none (engine.h): jobs of (id, prompt, max_tokens,
        // sampling), one stop list and owner for all; a SUBMIT_* code, ValueError on a bad grammar.
        .def("submit_all",
             [](engine & e, std::vector<std::tuple<int64_t, std::vector<int32_t>, int32_t, sampling_params>> jobs,
                std::vector<std::string> stop, int64_t owner) {
                 std::vector<generation_request> reqs;
                 reqs.reserve(jobs.size());
                 for (auto & [id, prompt, max_tokens, sampling] : jobs) {
                     reqs.push_back({id, owner, std::move(prompt), max_tokens, stop, std::move(sampling)});
                 }
                 py::gil_scoped_release release;
                 return (int) e.submit_all(std::move(reqs));
             },
             py::arg("jobs"), py::arg("stop"), py::arg("owner") = 0)
        .def("submit_embedding",
             [](engine & e, int64_t id, std::vector<std::vector<int32_t>> inputs, int64_t owner) {
                 py::gil_scoped_release release;
                 return (int) e.submit_embedding(id, owner, std::move(inputs));
             },
             py::arg("id"), py::arg("inputs"), py::arg("owner") = 0)
        .def("fail_next_decodes", &engine::fail_next_decodes)
        .def("set_tp_full_rows", &engine::set_tp_full_rows)
        .def("set_compute_scale", &engine::set_compute_scale)
        .def("cancel", &engine::cancel)
        .def("take_events",
             [](engine & e) {
                 std::vector<engine_event> events = e.take_events();
                 py::list out(events.size());
                 for (size_t i = 0; i < events.size(); ++i) {
                     out[i] = py::cast(std::move(events[i]));
                 }
                 return out;
             })
        // An engine worker's socket (frame_sink.h), made here and handed to the engine as its
        // event_sink: every frame to the daemon goes through it, the engine thread's events and
        // the worker's own, in order.
        .def("attach_sink",
             [](engine & e, int fd) { e.attach_sink(std::make_unique<frame_sink>(fd)); },
             py::arg("fd"))
        .def("relay_events", &engine::relay_events,
             "Writes the events the engine left for this thread to the sink as one frame; "
             "returns whether any ends a request.")
        .def("send_frame",
             [](engine & e, const py::bytes & data) {
                 const std::string_view view = data;
                 return sink_of(e).write(view);
             },
             py::arg("data"), "Queues or sends a whole frame; True when bytes wait for POLLOUT.")
        .def("flush_sink", [](engine & e) { return sink_of(e).flush(); },
             "Sends what waits, as far as the socket takes it; True when bytes still wait.")
        .def("sink_pending", [](engine & e) { return sink_of(e).pending(); })
        .def("sink_broken", [](engine & e) { return sink_of(e).broken(); })
        .def("fileno", &engine::event_fd)
        // Tensor parallelism (native/engine/lockstep.h): a follower's loop, and the leader's loss.
        .def("follow", &engine::follow, py::call_guard<py::gil_scoped_release>(),
             "A follower mirrors its leader's decodes until a stop, a lost link or close(); the reason.")
        .def_property_readonly("tensor_lost", &engine::tensor_lost)
        .def("close", &engine::close, py::call_guard<py::gil_scoped_release>())
        .def("stats", [](const engine & e) { return stats_to_python(e.stats()); })
        .def("prompt_cache_flush", &engine::flush_prompt_cache, py::call_guard<py::gil_scoped_release>())
        .def("metrics", [](engine & e) { return metrics_to_python(e.observer()); })
        .def("trace_start", [](engine & e) { return e.observer().trace().start(); })
        .def("trace_stop",
             [](engine & e) {
                 stopped_trace trace;
                 {
                     py::gil_scoped_release release;
                     trace.records = e.observer().trace().stop();
                 }
                 return trace;
             })
        .def("tokenize", &engine::tokenize, py::call_guard<py::gil_scoped_release>(),
             py::arg("text"), py::arg("add_special") = true,
             py::arg("parse_special") = false)
        .def("piece", [](const engine & e, int32_t token, bool special) { return py::bytes(e.piece(token, special)); },
             py::arg("token"), py::arg("special") = false)
        .def("meta", &engine::meta)
        .def_property_readonly("chat_template", &engine::chat_template)
        .def_property_readonly("n_ctx_train", &engine::n_ctx_train)
        .def_property_readonly("n_embd", &engine::n_embd)
        .def_property_readonly("n_vocab", &engine::n_vocab)
        .def_property_readonly("n_params", &engine::n_params)
        .def_property_readonly("model_size", &engine::model_size)
        .def_property_readonly("description", &engine::description)
        .def_property_readonly("token_bos", &engine::token_bos)
        .def_property_readonly("token_eos", &engine::token_eos)
        // Facts of the running engine, named like n_vocab (a worker reports them to the daemon).
        .def_property_readonly("n_slots", [](const engine & e) { return e.params().slots; })
        .def_property_readonly("n_ctx_seq", [](const engine & e) { return e.params().context_length; })
        .def_property_readonly("n_lanes", &engine::n_lanes);

    // A model's vocabulary and metadata without its weights: what the daemon needs to render,
    // tokenize and validate while the engine itself runs in a worker process.
    py::class_<model_vocab>(m, "Vocab")
        .def(py::init([](const std::string & path) {
                 py::gil_scoped_release release;
                 return std::make_unique<model_vocab>(path);
             }),
             py::arg("model_path"))
        .def("tokenize",
             [](const model_vocab & v, const std::string & text, bool add_special, bool parse_special) {
                 return tokenize_text(v.vocab(), text, add_special, parse_special);
             },
             py::call_guard<py::gil_scoped_release>(), py::arg("text"), py::arg("add_special") = true,
             py::arg("parse_special") = false)
        .def("piece", [](const model_vocab & v, int32_t token, bool special) {
                 return py::bytes(token_piece(v.vocab(), token, special));
             }, py::arg("token"), py::arg("special") = false)
        .def("meta", [](const model_vocab & v, const std::string & key) { return model_meta(v.model(), key); })
        .def_property_readonly("chat_template", [](const model_vocab & v) { return model_chat_template(v.model()); })
        .def_property_readonly("description", [](const model_vocab & v) { return model_description(v.model()); })
        .def_property_readonly("n_ctx_train", [](const model_vocab & v) { return llama_model_n_ctx_train(v.model()); })
        .def_property_readonly("n_embd", [](const model_vocab & v) { return llama_model_n_embd(v.model()); })
        .def_property_readonly("n_vocab", [](const model_vocab & v) { return llama_vocab_n_tokens(v.vocab()); })
        .def_property_readonly("token_bos", [](const model_vocab & v) { return llama_vocab_bos(v.vocab()); })
        .def_property_readonly("token_eos", [](const model_vocab & v) { return llama_vocab_eos(v.vocab()); });

    // One request's sampler outside any engine, on a vocabulary: the tests compare the ways of
    // finding an allowed token after the grammar rejects a pick, and bench/hostile.py times them.
    py::class_<request_sampler>(m, "Sampler")
        .def(py::init([](const model_vocab & v, const sampling_params & p, bool full_vocabulary) {
                 return std::make_unique<request_sampler>(
                     p, v.vocab(), full_vocabulary ? GRAMMAR_FALLBACK_FULL_VOCABULARY : GRAMMAR_FALLBACK_BY_LOGIT);
             }),
             py::arg("vocab"), py::arg("params"), py::arg("full_vocabulary") = false, py::keep_alive<1, 2>())
        .def("sample",
             [](request_sampler & s, const py::array_t<float, py::array::c_style | py::array::forcecast> & logits,
                bool suppress_eog, std::vector<int32_t> eog) {
                 std::sort(eog.begin(), eog.end());
                 if (!eog.empty() && (eog.front() < 0 || eog.back() >= logits.size())) {
                     throw py::value_error("an end-of-generation token is outside the logits");
                 }
                 return s.sample(logits.data(), (int32_t) logits.size(), suppress_eog, eog);
             },
             py::arg("logits"), py::arg("suppress_eog") = false, py::arg("eog") = std::vector<int32_t>{})
        .def("accept", &request_sampler::accept)
        .def_property_readonly("thinking", [](const request_sampler & s) {
            static const char * names[] = {"off", "idle", "counting", "forcing", "done"};
            return std::string(names[s.thinking()]);
        })
        .def_property_readonly("thinking_tokens", &request_sampler::thinking_tokens)
        .def_property_readonly("counts", [](const request_sampler & s) {
            const grammar_counts & c = s.counts();
            py::dict d;
#define GRAMMAR_COUNT_ENTRY(member, name) d[#name] = c.member;
            STACKD_GRAMMAR_COUNTS(GRAMMAR_COUNT_ENTRY)
#undef GRAMMAR_COUNT_ENTRY
            return d;
        });

    py::class_<py_scheduler>(m, "Scheduler")
        .def(py::init<int32_t, int32_t, int32_t, int32_t, int32_t, bool>(), py::arg("n_slots"),
             py::arg("n_batch"), py::arg("n_ctx_seq"), py::arg("n_max_waiting") = 256,
             py::arg("n_max_slots_per_owner") = 0, py::arg("share_time") = false)
        .def("enqueue", &py_scheduler::enqueue, py::arg("id"), py::arg("prompt"),
             py::arg("max_tokens"), py::arg("owner") = 0)
        .def("fail", &py_scheduler::fail)
        .def("set_active_slots", &py_scheduler::set_active_slots)
        .def("cancel", &py_scheduler::cancel)
        .def("schedule", &py_scheduler::schedule)
        .def("apply", &py_scheduler::apply)
        .def("charge", &py_scheduler::charge, py::arg("decode_us"), py::arg("sample_us"))
        .def("slot_cache", &py_scheduler::slot_cache)
        .def("request", &py_scheduler::request)
        .def("release", &py_scheduler::release)
        .def_property_readonly("n_waiting", &py_scheduler::n_waiting)
        .def_property_readonly("n_running", &py_scheduler::n_running);

    py::class_<text_stream>(m, "TextStream")
        .def(py::init<std::vector<std::string>>(), py::arg("stops") = std::vector<std::string>{})
        .def("push", [](text_stream & s, const py::bytes & piece) { return py::bytes(s.push(piece)); })
        .def("flush", [](text_stream & s) { return py::bytes(s.flush()); })
        .def_property_readonly("stopped", &text_stream::stopped)
        .def_property_readonly("matched", [](const text_stream & s) {
            return s.matched().empty() ? py::object(py::none()) : py::object(py::str(s.matched()));
        });
}
