// HMAC-SHA256 for the exchange's frame tags, over the system's libcrypto (OpenSSL 3), opened
// with dlopen at the first attach rather than linked: libcrypto.so.3 is on every machine
// Python's hashlib runs on, its headers and link symlink (libssl-dev) are not, and the kernels
// library gains no build or load dependency. Only SHA256_Init/Update/Final are used (stable
// since OpenSSL 0.9.8, exported by 3.x), with the key's inner and outer states computed once
// per link, so a tag costs two SHA-256 finals and no allocation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace stackd::tp {

// OpenSSL's public SHA256_CTX (openssl/sha.h), declared here so no header is needed.
struct Sha256State {
    uint32_t h[8];
    uint32_t nl, nh;
    uint32_t data[16];
    unsigned int num, md_len;
};

// Loads libcrypto once; false (and why) when it cannot.
bool crypto_available(std::string *why);

class Hmac {
public:
    void set_key(const uint8_t *key, size_t size);
    // The first 16 bytes of HMAC-SHA256(key, a + b).
    void tag(const void *a, size_t a_size, const void *b, size_t b_size, uint8_t out[16]) const;

private:
    Sha256State inner_{}, outer_{};
};

}  // namespace stackd::tp
