// What callers ask of a loaded model's file, shared by the engine (a full load) and the
// vocabulary (a vocab-only load the daemon keeps while the engine runs in a worker process).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "llama.h"

// llama.cpp logs only its errors from now on (to stderr).
void quiet_llama_log();

std::vector<int32_t> tokenize_text(const llama_vocab * vocab, const std::string & text,
                                   bool add_special, bool parse_special);
std::string model_meta(const llama_model * model, const std::string & key);
std::string model_chat_template(const llama_model * model);
std::string model_description(const llama_model * model);

// The vocabulary and metadata of a model file, without its weights (vocab_only).
class model_vocab {
public:
    explicit model_vocab(const std::string & path);
    ~model_vocab();
    model_vocab(const model_vocab &) = delete;
    model_vocab & operator=(const model_vocab &) = delete;

    const llama_model * model() const { return model_; }
    const llama_vocab * vocab() const { return vocab_; }

private:
    llama_model * model_ = nullptr;
    const llama_vocab * vocab_ = nullptr;
};
