// pybind11 bindings: the private module `server._engine`, re-exported by `server.engine`.
// Every call that may take time (loading, closing, submitting) releases the GIL; the
// engine's own thread never holds it.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "engine/engine.h"
#include "engine/model_facts.h"
#include "engine/scheduler.h"
#include "engine/text_stream.h"

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

// (id, text, n_tokens, status, n_prompt, n_cached, n_generated, logprobs, embedding, error)
py::tuple event_to_python(engine_event & ev) {
    py::object embedding = py::none();
    if (!ev.embedding.empty()) {
        embedding = py::array_t<float>((py::ssize_t) ev.embedding.size(), ev.embedding.data());
    }
    return py::make_tuple(ev.id_request, py::bytes(ev.text), ev.n_tokens, (int) ev.status,
                          ev.n_prompt, ev.n_cached, ev.n_generated, logprobs_to_python(ev.logprobs),
                          embedding, ev.error.empty() ? py::object(py::none()) : py::str(ev.error));
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
    out["n_tokens"] = plan.n_tokens;
    return out;
}

// The scheduling policy alone, for tests with a fake decoder.
class py_scheduler {
public:
    py_scheduler(int32_t n_slots, int32_t n_batch, int32_t n_ctx_seq, int32_t n_max_waiting,
                 int32_t n_max_slots_per_owner)
        : sched_(scheduler_params{n_slots, n_batch, n_ctx_seq, n_max_waiting, n_max_slots_per_owner}) {}

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

    py::class_<sampling_params> sampling(m, "SamplingParams");
    sampling.def(py::init<>());
#define STACKD_SAMPLING_BINDING(type, name, init) sampling.def_readwrite(#name, &sampling_params::name);
    STACKD_SAMPLING_FIELDS(STACKD_SAMPLING_BINDING)
#undef STACKD_SAMPLING_BINDING

    py::class_<engine>(m, "Engine")
        .def(py::init([](const std::string & model_path, bool embeddings, int32_t n_slots,
                         int32_t n_ctx_seq, int32_t n_batch, int32_t n_threads, int32_t n_max_waiting,
                         int32_t flash_attn, float key_share, bool quiet) {
                 engine_params p;
                 p.model_path = model_path;
                 p.embeddings = embeddings;
                 p.n_slots = n_slots;
                 p.n_ctx_seq = n_ctx_seq;
                 p.n_batch = n_batch;
                 p.n_threads = n_threads;
                 p.n_max_waiting = n_max_waiting;
                 p.flash_attn = flash_attn;
                 p.key_share = key_share;
                 p.quiet = quiet;
                 py::gil_scoped_release release;
                 return std::make_unique<engine>(p);
             }),
             py::arg("model_path"), py::arg("embeddings") = false, py::arg("n_slots") = 4,
             py::arg("n_ctx_seq") = 2048, py::arg("n_batch") = 512, py::arg("n_threads") = 0,
             py::arg("n_max_waiting") = 256, py::arg("flash_attn") = -1, py::arg("key_share") = 1.0f,
             py::arg("quiet") = true)
        .def("submit",
             [](engine & e, int64_t id, std::vector<int32_t> prompt, int32_t max_tokens,
                std::vector<std::string> stop, const sampling_params & sampling, int64_t owner) {
                 generation_request req{id, owner, std::move(prompt), max_tokens, std::move(stop), sampling};
                 py::gil_scoped_release release;
                 return (int) e.submit(std::move(req));
             },
             py::arg("id"), py::arg("prompt"), py::arg("max_tokens"), py::arg("stop"),
             py::arg("sampling"), py::arg("owner") = 0)
        .def("submit_embedding",
             [](engine & e, int64_t id, std::vector<std::vector<int32_t>> inputs, int64_t owner) {
                 py::gil_scoped_release release;
                 return (int) e.submit_embedding(id, owner, std::move(inputs));
             },
             py::arg("id"), py::arg("inputs"), py::arg("owner") = 0)
        .def("fail_next_decodes", &engine::fail_next_decodes)
        .def("set_compute_scale", &engine::set_compute_scale)
        .def("cancel", &engine::cancel)
        .def("take_events",
             [](engine & e) {
                 std::vector<engine_event> events = e.take_events();
                 py::list out(events.size());
                 for (size_t i = 0; i < events.size(); ++i) {
                     out[i] = event_to_python(events[i]);
                 }
                 return out;
             })
        .def("fileno", &engine::event_fd)
        .def("close", &engine::close, py::call_guard<py::gil_scoped_release>())
        .def("stats",
             [](const engine & e) {
                 const engine_stats s = e.stats();
                 py::dict d;
                 d["n_steps"] = s.n_steps;
                 d["n_tokens_decoded"] = s.n_tokens_decoded;
                 d["n_tokens_sampled"] = s.n_tokens_sampled;
                 d["t_schedule_us"] = s.t_schedule_us;
                 d["t_batch_us"] = s.t_batch_us;
                 d["t_decode_us"] = s.t_decode_us;
                 d["t_sample_us"] = s.t_sample_us;
                 d["t_emit_us"] = s.t_emit_us;
                 return d;
             })
        .def("tokenize", &engine::tokenize, py::call_guard<py::gil_scoped_release>(),
             py::arg("text"), py::arg("add_special") = true,
             py::arg("parse_special") = false)
        .def("piece", [](const engine & e, int32_t token) { return py::bytes(e.piece(token)); })
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
        .def_property_readonly("n_slots", [](const engine & e) { return e.params().n_slots; })
        .def_property_readonly("n_ctx_seq", [](const engine & e) { return e.params().n_ctx_seq; });

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
        .def("piece", [](const model_vocab & v, int32_t token) {
                 return py::bytes(token_piece(v.vocab(), token));
             })
        .def("meta", [](const model_vocab & v, const std::string & key) { return model_meta(v.model(), key); })
        .def_property_readonly("chat_template", [](const model_vocab & v) { return model_chat_template(v.model()); })
        .def_property_readonly("description", [](const model_vocab & v) { return model_description(v.model()); })
        .def_property_readonly("n_ctx_train", [](const model_vocab & v) { return llama_model_n_ctx_train(v.model()); })
        .def_property_readonly("n_embd", [](const model_vocab & v) { return llama_model_n_embd(v.model()); })
        .def_property_readonly("n_vocab", [](const model_vocab & v) { return llama_vocab_n_tokens(v.vocab()); })
        .def_property_readonly("token_bos", [](const model_vocab & v) { return llama_vocab_bos(v.vocab()); })
        .def_property_readonly("token_eos", [](const model_vocab & v) { return llama_vocab_eos(v.vocab()); });

    py::class_<py_scheduler>(m, "Scheduler")
        .def(py::init<int32_t, int32_t, int32_t, int32_t, int32_t>(), py::arg("n_slots"),
             py::arg("n_batch"), py::arg("n_ctx_seq"), py::arg("n_max_waiting") = 256,
             py::arg("n_max_slots_per_owner") = 0)
        .def("enqueue", &py_scheduler::enqueue, py::arg("id"), py::arg("prompt"),
             py::arg("max_tokens"), py::arg("owner") = 0)
        .def("fail", &py_scheduler::fail)
        .def("set_active_slots", &py_scheduler::set_active_slots)
        .def("cancel", &py_scheduler::cancel)
        .def("schedule", &py_scheduler::schedule)
        .def("apply", &py_scheduler::apply)
        .def("slot_cache", &py_scheduler::slot_cache)
        .def("request", &py_scheduler::request)
        .def("release", &py_scheduler::release)
        .def_property_readonly("n_waiting", &py_scheduler::n_waiting)
        .def_property_readonly("n_running", &py_scheduler::n_running);

    py::class_<text_stream>(m, "TextStream")
        .def(py::init<std::vector<std::string>>(), py::arg("stops") = std::vector<std::string>{})
        .def("push", [](text_stream & s, const py::bytes & piece) { return py::bytes(s.push(piece)); })
        .def("flush", [](text_stream & s) { return py::bytes(s.flush()); })
        .def_property_readonly("stopped", &text_stream::stopped);
}
