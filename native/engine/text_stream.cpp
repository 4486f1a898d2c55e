#include "text_stream.h"

#include <algorithm>

size_t utf8_complete_prefix(const std::string & s) {
    const size_t n = s.size();
    // Look back at most 3 bytes for the lead byte of the last character.
    for (size_t back = 1; back <= 4 && back <= n; ++back) {
        const unsigned char c = (unsigned char) s[n - back];
        if ((c & 0xC0) == 0x80) {
            continue;                       // continuation byte: keep looking
        }
        size_t len = 1;
        if ((c & 0xE0) == 0xC0) len = 2;
        else if ((c & 0xF0) == 0xE0) len = 3;
        else if ((c & 0xF8) == 0xF0) len = 4;
        return back >= len ? n : n - back;  // the last character is whole, or not yet
    }
    return n;                               // stray continuation bytes: release them as they are
}

text_stream::text_stream(std::vector<std::string> stops) {
    for (auto & stop : stops) {
        if (!stop.empty()) {
            stops_.push_back(std::move(stop));
        }
    }
}

std::string text_stream::push(const std::string & piece) {
    if (stopped_) {
        return {};
    }
    pending_ += piece;
    const size_t complete = utf8_complete_prefix(pending_);

    size_t stop_at = std::string::npos;
    const std::string * first = nullptr;     // the earliest in the text; the first listed on a tie
    for (const std::string & stop : stops_) {
        const size_t pos = pending_.find(stop);
        if (pos != std::string::npos && pos + stop.size() <= complete && pos < stop_at) {
            stop_at = pos;
            first = &stop;
        }
    }
    if (first != nullptr) {
        std::string out = pending_.substr(0, stop_at);
        pending_.clear();
        stopped_ = true;
        matched_ = *first;
        return out;
    }

    // Hold back the longest tail that is the start of some stop string.
    size_t hold = 0;
    for (const std::string & stop : stops_) {
        for (size_t k = std::min(stop.size() - 1, complete); k > hold; --k) {
            if (pending_.compare(complete - k, k, stop, 0, k) == 0) {
                hold = k;
                break;
            }
        }
    }
    const size_t release = complete - hold;
    std::string out = pending_.substr(0, release);
    pending_.erase(0, release);
    return out;
}

std::string text_stream::flush() {
    if (stopped_) {
        return {};
    }
    std::string out = pending_.substr(0, utf8_complete_prefix(pending_));
    pending_.clear();
    return out;
}
