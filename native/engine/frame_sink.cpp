#include "frame_sink.h"

#include <sys/socket.h>

#include <cerrno>

#include "event_wire.h"

bool frame_sink::write_events(const std::vector<engine_event> & events) {
    return write(events_frame(events));
}

bool frame_sink::write(std::string_view bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    if (broken_) {
        return false;
    }
    size_t sent = 0;
    if (waiting_.empty()) {            // nothing before it: straight to the socket
        sent = send_some(bytes.data(), bytes.size());
    }
    if (!broken_ && sent < bytes.size()) {
        waiting_.append(bytes.data() + sent, bytes.size() - sent);
    }
    return !waiting_.empty();
}

bool frame_sink::flush() {
    std::lock_guard<std::mutex> lock(mu_);
    if (!broken_ && !waiting_.empty()) {
        waiting_.erase(0, send_some(waiting_.data(), waiting_.size()));
    }
    return !waiting_.empty();
}

bool frame_sink::pending() const {
    std::lock_guard<std::mutex> lock(mu_);
    return !waiting_.empty();
}

bool frame_sink::broken() const {
    std::lock_guard<std::mutex> lock(mu_);
    return broken_;
}

// Under mu_. Stops at a full buffer; any other failure marks the sink broken and drops what
// waits (no reader is left to take it).
size_t frame_sink::send_some(const char * data, size_t size) {
    size_t sent = 0;
    while (sent < size) {
        const ssize_t n = ::send(fd_, data + sent, size - sent, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n > 0) {
            sent += (size_t) n;
        } else if (n < 0 && errno == EINTR) {
            continue;
        } else {
            if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) {
                broken_ = true;
                waiting_.clear();
            }
            break;
        }
    }
    return sent;
}
