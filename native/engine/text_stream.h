// Incremental detokenization with stop strings.
//
// Token pieces arrive as bytes. Text is released only as whole UTF-8 characters, and a
// tail that could still turn into a stop string is held back, so nothing is ever
// emitted and then retracted. When a stop string appears, the text before it is the
// last thing released.
#pragma once

#include <string>
#include <vector>

class text_stream {
public:
    explicit text_stream(std::vector<std::string> stops = {});

    // Add a token's bytes; returns the text that can be released now.
    std::string push(const std::string & piece);
    // End of generation without a stop: release what was held back (whole characters only).
    std::string flush();

    bool stopped() const { return stopped_; }
    // The stop string that ended the text ("" while none has): a client is told which one
    // (Anthropic's stop_sequence, vLLM's stop_reason).
    const std::string & matched() const { return matched_; }

private:
    std::vector<std::string> stops_;
    std::string pending_;
    bool stopped_ = false;
    std::string matched_;
};

// Length of the longest prefix of `s` that does not end inside a UTF-8 character.
size_t utf8_complete_prefix(const std::string & s);
