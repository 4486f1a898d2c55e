// Engine events between a worker process and the daemon, as bytes: the worker's engine thread
// output crosses in one call on each side (no Python object per field), which is what a token
// costs the relay. The layout is plain little-endian fields, lengths before bytes:
//
//   event:    i64 id_request, i32 n_tokens, i32 status, i32 n_prompt, i32 n_cached,
//             i32 n_generated, str text, str error, str stop, u8 has_timings [4 x i64 timings],
//             u32 n_logprobs x logprob, u32 n_prompt_logprobs x logprob, u32 n_floats x f32 embedding
//   logprob:  alt chosen, u32 n_top x alt        alt: i32 token, f32 logprob, str piece
//   str:      u32 length, bytes
//
// The daemon decodes what a process running llama.cpp on a registry's file wrote, so decoding
// trusts nothing: every length is checked against what is left, the status against its enum.
#pragma once

#include <string>
#include <vector>

#include "engine_event.h"

// Appends the events to `out`.
void encode_events(const std::vector<engine_event> & events, std::string & out);
// The events as one whole `events` frame of server/engine/wire.py: u32 body length, u32 header
// length, the header {"op":"events"}, then the events as above.
std::string events_frame(const std::vector<engine_event> & events);
// The events in data[0, size); std::invalid_argument when the bytes break the layout.
std::vector<engine_event> decode_events(const char * data, size_t size);
