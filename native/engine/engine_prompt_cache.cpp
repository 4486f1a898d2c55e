// The engine's side of the prompt cache on disk (prompt_cache.h): which prompts are saved and
// when, and a saved prefix put back into a slot at admission.
//
// Saved: a prompt of at least prompt_cache_min_tokens that would add that many tokens to what
// the files hold (prompt_cache::worth_saving), right after the decode of its last chunk, when
// its sequence holds exactly its KV (the first sample is not decoded yet). The copy
// out of llama.cpp (llama_state_seq_get_data, a memcpy of the cells) is on the engine thread,
// since only it may touch the context; the file is written by the cache's own thread.
// Restored: at admission, when a file shares a longer prefix with the prompt than the chosen
// slot holds in memory (the scheduler picked the free slot with the longest), and at least
// min_tokens, the file is read and checked, its state replaces the slot's sequence, and the
// sequence is cut where the prompt parts from it; the prompt's last token is always decoded
// again (its logits give the first sample), as with prefix reuse in memory.
// The restored cells are byte for byte those the first prefill computed, so the answer is the
// one the engine gives with that prefix reused in memory (docs/engine.md, "Prompt cache").
#include "engine.h"
#include "engine_steps.h"

void engine::make_prompt_cache(const llama_context_params & cp) {
    const bool usable = !params_.embeddings && params_.tp_rank < 0 && params_.placement.rpc_endpoints.empty() &&
                        params_.n_lanes == 1 && !params_.prompt_cache_dir.empty() && params_.prompt_cache_bytes > 0;
    if (!usable) {
        return;
    }
    // What the state's layout and numbers depend on that the caller does not know: llama.cpp
    // refuses a state of another stream count (slots), and K and V differ with their type and
    // with flash attention (V transposed, other arithmetic).
    prompt_cache_params pc;
    pc.dir = params_.prompt_cache_dir;
    pc.root = params_.prompt_cache_root;
    pc.key = params_.prompt_cache_key + ";kv_type=" + std::to_string(params_.kv_type) +
             ";flash_attn=" + std::to_string((int) cp.flash_attn_type) +
             ";context_length=" + std::to_string(params_.context_length) +
             ";slots=" + std::to_string(params_.slots) + ";n_vocab=" + std::to_string(n_vocab()) +
             ";n_embd=" + std::to_string(n_embd()) + ";n_layer=" + std::to_string(llama_model_n_layer(model_));
    pc.min_tokens = std::max(1, params_.prompt_cache_min_tokens);
    pc.max_bytes = (uint64_t) params_.prompt_cache_bytes;
    pc.disk_reserve = (uint64_t) std::max<int64_t>(0, params_.prompt_cache_disk_reserve);
    pcache_ = std::make_unique<prompt_cache>(std::move(pc));
}

void engine::restore_prefixes(lane & ln, batch_plan & plan) {
    if (!pcache_) {
        return;
    }
    const int32_t min_tokens = pcache_->params().min_tokens;
    for (const plan_admission adm : plan.admissions) {
        const sched_request * req = ln.sched.find(adm.id_request);
        const int32_t n_prompt = (int32_t) req->prompt.size();
        // Nothing saved could be longer than what memory gives, or the prompt is too short to
        // have a saved prefix: no lookup, neither hit nor miss.
        if (n_prompt < min_tokens || adm.n_keep >= n_prompt - 1) {
            continue;
        }
        const uint64_t t0 = now_us();
        const prompt_cache::found f = pcache_->find(req->prompt, adm.n_keep, n_prompt);
        prompt_cache::state_view state;
        if (f.n_common == 0 || !pcache_->load(f, req->prompt, state)) {
            pcache_->counters.misses += 1;
            continue;
        }
        if (llama_state_seq_set_data(ln.ctx, state.data(), state.size(), adm.id_slot) == 0) {
            // A state llama.cpp refuses (the key should have kept it out): the sequence may be
            // half written, so it starts over empty, and the file goes.
            tp_->seq_rm(ln.ctx, adm.id_slot, -1, -1);
            ln.sched.restored(plan, adm.id_request, 0);
            pcache_->reject(f.path);
            pcache_->counters.misses += 1;
            continue;
        }
        // The file may go on past where the prompt parts from it: the admission cuts the
        // sequence at the shared prefix (seq_rm from n_keep), as for a prefix reused in memory.
        ln.sched.restored(plan, adm.id_request, f.n_common);
        pcache_->counters.hits += 1;
        pcache_->counters.restored_tokens += (uint64_t) std::min(f.n_common, n_prompt - 1);
        pcache_->counters.restore_us += now_us() - t0;
    }
}

// At load (the constructor, before the loop runs): the most recently used files, as many as
// prompt_cache_preload and the slots allow, restored into idle slots from the last one down.
// A restart or a swap then leaves the engine as it was: the next turn of the conversations it
// served last reuses its prefix in memory, with no read and no lookup before its first token.
// The first free slot goes to a request with nothing in common, so these stay until they are
// the least recently used. What a load costs more is one read of each file (page cache or disk).
void engine::preload_prefixes(lane & ln) {
    const int32_t n_slots = ln.sched.params().n_slots;
    const int32_t n = std::min(params_.prompt_cache_preload, n_slots);
    if (n <= 0) {
        return;
    }
    // A prompt leaves room for at least one generated token in its sequence.
    const int32_t n_max = ln.sched.params().n_ctx_seq - 1;
    int32_t id_slot = n_slots - 1;
    for (const prompt_cache::held & h : pcache_->recent((size_t) n, n_max)) {
        const uint64_t t0 = now_us();
        prompt_cache::state_view state;
        if (!pcache_->load(h.file, h.tokens, state)) {
            continue;                      // damaged: removed and counted by load()
        }
        if (llama_state_seq_set_data(ln.ctx, state.data(), state.size(), id_slot) == 0) {
            tp_->seq_rm(ln.ctx, id_slot, -1, -1);
            pcache_->reject(h.file.path);
            continue;
        }
        ln.sched.preloaded(id_slot, h.tokens);
        pcache_->counters.preloads += 1;
        pcache_->counters.preloaded_tokens += h.tokens.size();
        pcache_->counters.restore_us += now_us() - t0;
        id_slot -= 1;
    }
}

void engine::save_prefixes(lane & ln, const batch_plan & plan) {
    if (!pcache_) {
        return;
    }
    for (const plan_item & item : plan.items) {
        if (!item.is_prompt || !item.want_logits) {
            continue;                      // not the end of a prompt
        }
        const sched_request * req = ln.sched.find(item.id_request);
        if (req == nullptr || req->preempted || (int32_t) req->prompt.size() < pcache_->params().min_tokens ||
            !pcache_->worth_saving(req->prompt)) {
            continue;
        }
        const size_t size = llama_state_seq_get_size(ln.ctx, item.id_slot);
        std::vector<uint8_t> state(size);
        if (size == 0 || llama_state_seq_get_data(ln.ctx, state.data(), size, item.id_slot) != size) {
            pcache_->counters.saves_skipped += 1;
            continue;
        }
        pcache_->save(req->prompt, std::move(state));
    }
}
