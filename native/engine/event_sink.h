// Where an engine's events go as its threads make them, instead of waiting for take_events():
// in an engine worker, the socket to the daemon (frame_sink.h). The engine core knows only
// this interface; what the events become on the way (event_wire.h's frames) and where they
// go is the sink's business, and the sink is made and attached by whoever owns the socket
// (the bindings' Engine.attach_sink).
#pragma once

#include <vector>

struct engine_event;   // engine_event.h

class event_sink {
public:
    virtual ~event_sink() = default;

    // Takes `events` as one unit, after everything written before. Called under the engine's
    // event lock, from an engine thread at the end of a step or from the thread that relays
    // (engine::relay_events), so it must never block. True when part of it waits for the
    // relaying thread (the one watching the event fd) to finish the job.
    virtual bool write_events(const std::vector<engine_event> & events) = 0;
};
