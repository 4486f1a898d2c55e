#include "trace.h"

bool trace_recorder::start() {
    std::lock_guard<std::mutex> lock(mu_);
    if (on_.load(std::memory_order_relaxed)) {
        return false;
    }
    records_.clear();
    on_.store(true, std::memory_order_relaxed);
    return true;
}

std::vector<trace_record> trace_recorder::stop() {
    std::lock_guard<std::mutex> lock(mu_);
    on_.store(false, std::memory_order_relaxed);
    std::vector<trace_record> out;
    out.swap(records_);
    return out;
}

void trace_recorder::add(const trace_record & record) {
    std::lock_guard<std::mutex> lock(mu_);
    // Checked again under the lock: a record racing stop() must not start the next trace.
    if (on_.load(std::memory_order_relaxed) && records_.size() < MAX_RECORDS) {
        records_.push_back(record);
    }
}
