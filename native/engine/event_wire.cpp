#include "event_wire.h"

#include <cstdint>
#include <cstring>
#include <stdexcept>

namespace {

template <typename T>
void put(std::string & out, T value) {
    out.append(reinterpret_cast<const char *>(&value), sizeof value);   // x86/ARM: little-endian
}

void put_str(std::string & out, const std::string & s) {
    put<uint32_t>(out, (uint32_t) s.size());
    out += s;
}

void put_alt(std::string & out, const token_logprob & t) {
    put<int32_t>(out, t.token);
    put<float>(out, t.logprob);
    put_str(out, t.piece);
}

constexpr size_t k_alt_min = 4 + 4 + 4;

void put_entries(std::string & out, const std::vector<logprob_entry> & entries) {
    put<uint32_t>(out, (uint32_t) entries.size());
    for (const logprob_entry & e : entries) {
        put_alt(out, e.chosen);
        put<uint32_t>(out, (uint32_t) e.top.size());
        for (const token_logprob & t : e.top) {
            put_alt(out, t);
        }
    }
}

class reader {
public:
    reader(const char * data, size_t size) : at_(data), end_(data + size) {}

    template <typename T>
    T get() {
        T value;
        std::memcpy(&value, take(sizeof value), sizeof value);
        return value;
    }
    std::string get_str() {
        const uint32_t n = get<uint32_t>();
        return std::string(take(n), n);
    }
    // A count of items of at least `min_bytes` each: bounded by what is left, so a forged
    // count cannot make us reserve gigabytes.
    uint32_t get_count(size_t min_bytes) {
        const uint32_t n = get<uint32_t>();
        if ((size_t) n > left() / min_bytes) {
            throw std::invalid_argument("event wire: a count past the end");
        }
        return n;
    }
    token_logprob get_alt() {
        token_logprob t;
        t.token = get<int32_t>();
        t.logprob = get<float>();
        t.piece = get_str();
        return t;
    }
    std::vector<logprob_entry> get_entries() {
        std::vector<logprob_entry> entries;
        const uint32_t n_entries = get_count(k_alt_min + 4);
        entries.reserve(n_entries);
        for (uint32_t i = 0; i < n_entries; ++i) {
            logprob_entry e{get_alt(), {}};
            const uint32_t n_top = get_count(k_alt_min);
            e.top.reserve(n_top);
            for (uint32_t k = 0; k < n_top; ++k) {
                e.top.push_back(get_alt());
            }
            entries.push_back(std::move(e));
        }
        return entries;
    }
    void get_floats(float * dst, size_t n) {
        std::memcpy(dst, take(n * sizeof(float)), n * sizeof(float));
    }
    size_t left() const { return (size_t) (end_ - at_); }

private:
    const char * take(size_t n) {
        if (n > left()) {
            throw std::invalid_argument("event wire: truncated");
        }
        const char * p = at_;
        at_ += n;
        return p;
    }
    const char * at_;
    const char * end_;
};

}  // namespace

void encode_events(const std::vector<engine_event> & events, std::string & out) {
    for (const engine_event & ev : events) {
        put<int64_t>(out, ev.id_request);
        put<int32_t>(out, ev.n_tokens);
        put<int32_t>(out, (int32_t) ev.status);
        put<int32_t>(out, ev.n_prompt);
        put<int32_t>(out, ev.n_cached);
        put<int32_t>(out, ev.n_generated);
        put_str(out, ev.text);
        put_str(out, ev.error);
        put_str(out, ev.stop);
        put<uint8_t>(out, ev.timings.known ? 1 : 0);
        if (ev.timings.known) {
            put<int64_t>(out, ev.timings.t_queue_us);
            put<int64_t>(out, ev.timings.t_prompt_us);
            put<int64_t>(out, ev.timings.t_first_token_us);
            put<int64_t>(out, ev.timings.t_predicted_us);
            put<int64_t>(out, ev.timings.n_drafted);
            put<int64_t>(out, ev.timings.n_draft_accepted);
        }
        put_entries(out, ev.logprobs);
        put_entries(out, ev.prompt_logprobs);
        put<uint32_t>(out, (uint32_t) ev.embedding.size());
        out.append(reinterpret_cast<const char *>(ev.embedding.data()), ev.embedding.size() * sizeof(float));
    }
}

std::string events_frame(const std::vector<engine_event> & events) {
    static const std::string header = "{\"op\":\"events\"}";
    std::string frame(8, '\0');
    frame += header;
    encode_events(events, frame);
    const uint32_t lengths[2] = {(uint32_t) (frame.size() - 8), (uint32_t) header.size()};
    std::memcpy(frame.data(), lengths, sizeof lengths);
    return frame;
}

std::vector<engine_event> decode_events(const char * data, size_t size) {
    std::vector<engine_event> events;
    reader in(data, size);
    while (in.left() > 0) {
        engine_event ev;
        ev.id_request = in.get<int64_t>();
        ev.n_tokens = in.get<int32_t>();
        const int32_t status = in.get<int32_t>();
        if (status < REQUEST_STATUS_WAITING || status > REQUEST_STATUS_FINISHED_ERROR) {
            throw std::invalid_argument("event wire: unknown request status");
        }
        ev.status = (request_status) status;
        ev.n_prompt = in.get<int32_t>();
        ev.n_cached = in.get<int32_t>();
        ev.n_generated = in.get<int32_t>();
        ev.text = in.get_str();
        ev.error = in.get_str();
        ev.stop = in.get_str();
        const uint8_t has_timings = in.get<uint8_t>();
        if (has_timings > 1) {
            throw std::invalid_argument("event wire: bad timings flag");
        }
        if (has_timings) {
            ev.timings.known = true;
            ev.timings.t_queue_us = in.get<int64_t>();
            ev.timings.t_prompt_us = in.get<int64_t>();
            ev.timings.t_first_token_us = in.get<int64_t>();
            ev.timings.t_predicted_us = in.get<int64_t>();
            ev.timings.n_drafted = in.get<int64_t>();
            ev.timings.n_draft_accepted = in.get<int64_t>();
        }
        ev.logprobs = in.get_entries();
        ev.prompt_logprobs = in.get_entries();
        const uint32_t n_floats = in.get_count(sizeof(float));
        ev.embedding.resize(n_floats);
        in.get_floats(ev.embedding.data(), n_floats);
        events.push_back(std::move(ev));
    }
    return events;
}
