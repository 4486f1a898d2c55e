// What the engine's two steps (engine_generate.cpp, engine_embed.cpp) share beyond engine.h:
// the step clock and the filling of a lane's batch. Private to the engine's sources.
#pragma once

#include <chrono>
#include <cstdint>

#include "llama.h"

inline uint64_t now_us() {
    return (uint64_t) std::chrono::duration_cast<std::chrono::microseconds>(
        std::chrono::steady_clock::now().time_since_epoch()).count();
}

inline void batch_add(llama_batch & batch, int32_t token, int32_t pos, int32_t seq, bool logits) {
    const int32_t i = batch.n_tokens++;
    batch.token[i] = token;
    batch.pos[i] = pos;
    batch.n_seq_id[i] = 1;
    batch.seq_id[i][0] = seq;
    batch.logits[i] = logits;
}
