// One ordered byte stream from an engine worker to the daemon, written by two threads: the
// engine thread (each step's events, straight from the step that made them: this is the
// engine's event_sink) and the worker's Python thread (verdicts, stats, traces, and events the
// engine left to it). Whole frames go in under one lock, so they never interleave; what the
// socket does not take at once waits here, in order, until the Python thread sees the socket
// writable and calls flush(). The bindings make it (Engine.attach_sink) and hand it to the
// engine, which sees only the event_sink.
//
// Why the engine thread writes at all: a token relayed by a second thread costs that thread's
// wake-up on every step, on cores the decode keeps busy (bench/README.md, "Engine worker against
// inline"). Written here it costs one non-blocking send.
#pragma once

#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "event_sink.h"

class frame_sink : public event_sink {
public:
    explicit frame_sink(int fd) : fd_(fd) {}
    frame_sink(const frame_sink &) = delete;
    frame_sink & operator=(const frame_sink &) = delete;

    // The events as one `events` frame (event_wire.h), written as write() does.
    bool write_events(const std::vector<engine_event> & events) override;

    // Sends what the socket takes now and keeps the rest, behind anything kept before; never
    // blocks. True when bytes wait for the socket to become writable.
    bool write(std::string_view bytes);
    // Sends what waits, as far as the socket takes it. True when bytes still wait.
    bool flush();
    bool pending() const;
    // Set once a send failed other than by a full buffer: the daemon is gone, and what waits
    // is dropped (the worker's Python thread sees EOF on its next read and exits).
    bool broken() const;

private:
    size_t send_some(const char * data, size_t size);

    const int fd_;
    mutable std::mutex mu_;
    std::string waiting_;
    bool broken_ = false;
};
