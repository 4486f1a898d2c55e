// The engine's counters, listed once. The stats struct, the Python dict that stats()
// returns, the Prometheus names and help text and the stub's EngineStats all come from
// this list (tests/observe checks the stub against it).
#pragma once

#include <cstdint>

// X(field, Prometheus name after "stackd_", Prometheus labels, help)
#define ENGINE_COUNTERS(X)                                                                         \
    X(n_steps, "engine_n_steps_total", "", "Decode steps run.")                                     \
    X(n_tokens_decoded, "engine_n_tokens_decoded_total", "", "Tokens decoded (prompt and generated).") \
    X(n_tokens_sampled, "engine_n_tokens_sampled_total", "", "Tokens sampled.")                     \
    X(t_schedule_us, "engine_t_schedule_us_total", "", "Microseconds spent scheduling.")            \
    X(t_batch_us, "engine_t_batch_us_total", "", "Microseconds spent building batches.")            \
    X(t_decode_us, "engine_t_decode_us_total", "", "Microseconds spent in llama_decode.")           \
    X(n_graphs_reused, "engine_graphs_reused_total", "",                                            \
      "Decode steps that reused the previous step's compute graph (llama.cpp's graph reuse).")     \
    X(t_sample_us, "engine_t_sample_us_total", "", "Microseconds spent sampling and detokenizing.") \
    X(t_emit_us, "engine_t_emit_us_total", "", "Microseconds spent emitting events.")              \
    X(n_prompt_tokens, "prompt_tokens_total", "", "Prompt tokens of admitted requests, cached or computed.") \
    X(n_generation_tokens, "generation_tokens_total", "", "Tokens generated.")                     \
    X(n_prefix_cache_hit_tokens, "prefix_cache_hit_tokens_total", "",                               \
      "Prompt tokens reused from the KV cache instead of computed.")                                \
    X(n_finished_stop, "request_success_total", "finished_reason=\"stop\"", "Requests finished, by finish reason.") \
    X(n_finished_length, "request_success_total", "finished_reason=\"length\"", "Requests finished, by finish reason.") \
    X(n_draft_tokens, "spec_decode_num_draft_tokens_total", "",                                     \
      "Drafted tokens verified (draftless speculative decoding: prompt lookup).")                  \
    X(n_draft_accepted_tokens, "spec_decode_num_accepted_tokens_total", "",                         \
      "Drafted tokens accepted (sampled as drafted).")                                              \
    X(n_cancelled, "requests_cancelled_total", "", "Requests cancelled before they finished.")      \
    X(n_errors, "engine_errors_total", "", "Requests the engine failed (a decode error or a refused queue entry).") \
    X(n_tp_gather_full, "tensor_logits_gathers_total", "path=\"full\"",                              \
      "A tensor split leader's decodes with output rows, by how the rows came: whole, or each follower's top candidates.") \
    X(n_tp_gather_candidates, "tensor_logits_gathers_total", "path=\"candidates\"",                  \
      "A tensor split leader's decodes with output rows, by how the rows came: whole, or each follower's top candidates.") \
    X(n_prompt_cache_hits, "prompt_cache_hits_total", "",                                           \
      "Admissions whose prompt prefix was restored from the prompt cache on disk.")                \
    X(n_prompt_cache_misses, "prompt_cache_misses_total", "",                                       \
      "Admissions of a prompt long enough to be saved that found no usable saved prefix.")         \
    X(n_prompt_cache_rejected, "prompt_cache_rejected_total", "",                                   \
      "Prompt cache files found truncated, damaged or foreign, and removed.")                      \
    X(n_prompt_cache_bytes_read, "prompt_cache_read_bytes_total", "", "Bytes of prompt cache files read by hits.") \
    X(n_prompt_cache_bytes_written, "prompt_cache_written_bytes_total", "", "Bytes of prompt cache files written.") \
    X(n_prompt_cache_saves, "prompt_cache_saves_total", "", "Prompt cache files written.")            \
    X(n_prompt_cache_saves_skipped, "prompt_cache_saves_skipped_total", "",                         \
      "Prompt cache saves not made: a failed write (a full disk), the disk reserve, the write queue full.") \
    X(n_prompt_cache_evictions, "prompt_cache_evictions_total", "",                                 \
      "Prompt cache files removed to keep all of them within models.prompt_cache_mb.")            \
    X(n_prompt_cache_superseded, "prompt_cache_superseded_total", "",                               \
      "Prompt cache files removed because a newer file holds all of their tokens and more.")      \
    X(n_prompt_cache_restored_tokens, "prompt_cache_restored_tokens_total", "",                     \
      "Prompt tokens whose KV was restored from the prompt cache on disk.")                        \
    X(t_prompt_cache_restore_us, "prompt_cache_restore_us_total", "",                               \
      "Microseconds spent restoring prompt prefixes from disk (lookup, read, checks, into the KV cache).") \
    X(n_prompt_cache_preloads, "prompt_cache_preloads_total", "",                                   \
      "Prompt cache files put back into idle slots when the model was loaded (models.prompt_cache_preload).") \
    X(n_prompt_cache_preloaded_tokens, "prompt_cache_preloaded_tokens_total", "",                   \
      "Prompt tokens whose KV a load put back into idle slots from the prompt cache on disk.")

// A snapshot of the counters (plain numbers), and the sum of two.
struct engine_stats {
#define ENGINE_STATS_FIELD(field, name, labels, help) uint64_t field = 0;
    ENGINE_COUNTERS(ENGINE_STATS_FIELD)
#undef ENGINE_STATS_FIELD

    engine_stats & operator+=(const engine_stats & other) {
#define ENGINE_STATS_ADD(field, name, labels, help) field += other.field;
        ENGINE_COUNTERS(ENGINE_STATS_ADD)
#undef ENGINE_STATS_ADD
        return *this;
    }
};
