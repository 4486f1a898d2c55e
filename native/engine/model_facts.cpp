#include "model_facts.h"

#include <algorithm>
#include <cstdio>
#include <stdexcept>

namespace {

void errors_only(ggml_log_level level, const char * text, void *) {
    if (level == GGML_LOG_LEVEL_ERROR) {
        fputs(text, stderr);
    }
}

}  // namespace

void quiet_llama_log() {
    llama_log_set(errors_only, nullptr);
}

std::vector<int32_t> tokenize_text(const llama_vocab * vocab, const std::string & text,
                                   bool add_special, bool parse_special) {
    std::vector<int32_t> tokens(text.size() + 8);
    int32_t n = llama_tokenize(vocab, text.data(), (int32_t) text.size(), tokens.data(),
                               (int32_t) tokens.size(), add_special, parse_special);
    if (n < 0) {
        tokens.resize(-n);
        n = llama_tokenize(vocab, text.data(), (int32_t) text.size(), tokens.data(),
                           (int32_t) tokens.size(), add_special, parse_special);
    }
    tokens.resize(std::max(n, 0));
    return tokens;
}

std::string model_meta(const llama_model * model, const std::string & key) {
    char buf[512];
    const int32_t n = llama_model_meta_val_str(model, key.c_str(), buf, sizeof(buf));
    if (n < 0) {
        return {};
    }
    if ((size_t) n < sizeof(buf)) {
        return std::string(buf, n);
    }
    std::string big(n + 1, '\0');
    llama_model_meta_val_str(model, key.c_str(), big.data(), big.size());
    big.resize(n);
    return big;
}

std::string model_chat_template(const llama_model * model) {
    const char * tmpl = llama_model_chat_template(model, nullptr);
    return tmpl != nullptr ? std::string(tmpl) : std::string();
}

std::string model_description(const llama_model * model) {
    char buf[256];
    const int32_t n = llama_model_desc(model, buf, sizeof(buf));
    return n > 0 ? std::string(buf, std::min<size_t>(n, sizeof(buf) - 1)) : std::string();
}

model_vocab::model_vocab(const std::string & path) {
    quiet_llama_log();
    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    mp.vocab_only = true;
    model_ = llama_model_load_from_file(path.c_str(), mp);
    if (model_ == nullptr) {
        throw std::runtime_error("cannot read the vocabulary of " + path);
    }
    vocab_ = llama_model_get_vocab(model_);
}

model_vocab::~model_vocab() {
    if (model_ != nullptr) {
        llama_model_free(model_);
    }
}
