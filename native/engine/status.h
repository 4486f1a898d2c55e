// Request status, ordered: every status after RUNNING is a finished kind.
#pragma once

#include <cstdint>

enum request_status : uint8_t {
    REQUEST_STATUS_WAITING = 0,          // queued, no slot yet
    REQUEST_STATUS_RUNNING,              // has a slot: prefilling or decoding
    REQUEST_STATUS_FINISHED_STOPPED,     // end of generation or a stop string
    REQUEST_STATUS_FINISHED_LENGTH,      // max_tokens or the context is full
    REQUEST_STATUS_FINISHED_ABORTED,     // cancelled (client went away)
    REQUEST_STATUS_FINISHED_ERROR,       // the decoder failed
};

inline bool request_status_is_finished(request_status status) {
    return status >= REQUEST_STATUS_FINISHED_STOPPED;
}

// The one table from status to OpenAI's finish_reason (nullptr: not finished).
inline const char * request_status_finish_reason(request_status status) {
    static const char * const table[] = {nullptr, nullptr, "stop", "length", "abort", "error"};
    return table[status];
}
