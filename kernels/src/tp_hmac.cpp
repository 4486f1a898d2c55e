#include "tp_hmac.h"

#include <dlfcn.h>

#include <cstring>
#include <mutex>

namespace stackd::tp {

namespace {

using InitFn = int (*)(Sha256State *);
using UpdateFn = int (*)(Sha256State *, const void *, size_t);
using FinalFn = int (*)(unsigned char *, Sha256State *);

struct Crypto {
    InitFn init = nullptr;
    UpdateFn update = nullptr;
    FinalFn final = nullptr;
    std::string error;
};

const Crypto &crypto() {
    static Crypto c;
    static std::once_flag once;
    std::call_once(once, [] {
        void *lib = nullptr;
        for (const char *name : {"libcrypto.so.3", "libcrypto.so"}) {
            if ((lib = dlopen(name, RTLD_NOW | RTLD_LOCAL)) != nullptr) break;
        }
        if (lib == nullptr) {
            c.error = "tensor parallelism needs the system's libcrypto (OpenSSL 3): libcrypto.so.3 not found";
            return;
        }
        c.init = (InitFn)dlsym(lib, "SHA256_Init");
        c.update = (UpdateFn)dlsym(lib, "SHA256_Update");
        c.final = (FinalFn)dlsym(lib, "SHA256_Final");
        if (c.init == nullptr || c.update == nullptr || c.final == nullptr) {
            c.init = nullptr;
            c.error = "the system's libcrypto has no SHA256_Init/Update/Final";
        }
    });
    return c;
}

constexpr size_t kBlock = 64;

}  // namespace

bool crypto_available(std::string *why) {
    const Crypto &c = crypto();
    if (c.init == nullptr && why != nullptr) *why = c.error;
    return c.init != nullptr;
}

void Hmac::set_key(const uint8_t *key, size_t size) {
    const Crypto &c = crypto();
    uint8_t k[kBlock] = {};
    if (size > kBlock) {
        Sha256State s;
        c.init(&s);
        c.update(&s, key, size);
        c.final(k, &s);
    } else {
        std::memcpy(k, key, size);
    }
    uint8_t pad[kBlock];
    for (size_t i = 0; i < kBlock; i++) pad[i] = k[i] ^ 0x36;
    c.init(&inner_);
    c.update(&inner_, pad, kBlock);
    for (size_t i = 0; i < kBlock; i++) pad[i] = k[i] ^ 0x5c;
    c.init(&outer_);
    c.update(&outer_, pad, kBlock);
}

void Hmac::tag(const void *a, size_t a_size, const void *b, size_t b_size, uint8_t out[16]) const {
    const Crypto &c = crypto();
    unsigned char digest[32];
    Sha256State s = inner_;
    c.update(&s, a, a_size);
    if (b_size) c.update(&s, b, b_size);
    c.final(digest, &s);
    s = outer_;
    c.update(&s, digest, sizeof digest);
    c.final(digest, &s);
    std::memcpy(out, digest, 16);
}

}  // namespace stackd::tp
