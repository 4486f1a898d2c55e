// The exchange's frame tags: ChaCha20-Poly1305 (RFC 8439) with the frame as associated data and
// nothing to encrypt, over the system's libcrypto (OpenSSL 3), opened with dlopen at the first
// attach rather than linked: libcrypto.so.3 is on every machine Python's hashlib runs on, its
// headers and link symlink (libssl-dev) are not, and the kernels library gains no build or load
// dependency. Poly1305 runs several times faster than the HMAC-SHA256 used before, a cost paid on
// both ends of every exchange (bench/tp_exchange.py --native; bench/README.md, "Measurements
// behind design choices").
//
// The nonce is the frame header's kind, sender and step (its bytes 4..16). A link's key is its
// session's (fresh per connection, frames.py's handshake) and tags the frames of one attached
// group only, whose step counter starts at 0 and only rises, and each node sends one frame of a
// kind per step: so no (key, nonce) pair ever tags two different frames, which Poly1305's
// one-time key requires.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace stackd::tp {

// Loads libcrypto once; false (and why) when it cannot.
bool crypto_available(std::string *why);

class FrameTag {
public:
    FrameTag() = default;
    FrameTag(const FrameTag &) = delete;
    FrameTag &operator=(const FrameTag &) = delete;
    FrameTag(FrameTag &&other) noexcept : ctx_(other.ctx_) { other.ctx_ = nullptr; }
    FrameTag &operator=(FrameTag &&other) noexcept;
    ~FrameTag();

    // false when libcrypto refused the key (then every tag() fails).
    bool set_key(const uint8_t key[32]);
    // The 16-byte tag of header (with its nonce at bytes 4..16) + payload; false when libcrypto fails.
    bool tag(const uint8_t *header, size_t header_size, const void *payload, size_t payload_size,
             uint8_t out[16]) const;

private:
    void *ctx_ = nullptr;   // EVP_CIPHER_CTX, keyed once
};

}  // namespace stackd::tp
