#include "tp_tag.h"

#include <dlfcn.h>

#include <algorithm>
#include <climits>
#include <mutex>

namespace stackd::tp {

namespace {

// OpenSSL's EVP AEAD calls (openssl/evp.h), declared here so no header is needed; stable since 1.1.0.
using NewFn = void *(*)();
using FreeFn = void (*)(void *);
using CipherFn = const void *(*)();
using InitFn = int (*)(void *ctx, const void *cipher, void *engine, const unsigned char *key, const unsigned char *iv);
using UpdateFn = int (*)(void *ctx, unsigned char *out, int *out_size, const unsigned char *in, int in_size);
using FinalFn = int (*)(void *ctx, unsigned char *out, int *out_size);
using CtrlFn = int (*)(void *ctx, int type, int arg, void *ptr);
constexpr int kCtrlAeadGetTag = 0x10;   // EVP_CTRL_AEAD_GET_TAG

struct Crypto {
    NewFn ctx_new = nullptr;
    FreeFn ctx_free = nullptr;
    CipherFn chacha20_poly1305 = nullptr;
    InitFn init = nullptr;
    UpdateFn update = nullptr;
    FinalFn final = nullptr;
    CtrlFn ctrl = nullptr;
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
        c.ctx_new = (NewFn)dlsym(lib, "EVP_CIPHER_CTX_new");
        c.ctx_free = (FreeFn)dlsym(lib, "EVP_CIPHER_CTX_free");
        c.chacha20_poly1305 = (CipherFn)dlsym(lib, "EVP_chacha20_poly1305");
        c.init = (InitFn)dlsym(lib, "EVP_EncryptInit_ex");
        c.update = (UpdateFn)dlsym(lib, "EVP_EncryptUpdate");
        c.final = (FinalFn)dlsym(lib, "EVP_EncryptFinal_ex");
        c.ctrl = (CtrlFn)dlsym(lib, "EVP_CIPHER_CTX_ctrl");
        if (!c.ctx_new || !c.ctx_free || !c.chacha20_poly1305 || !c.init || !c.update || !c.final || !c.ctrl ||
            c.chacha20_poly1305() == nullptr) {
            c.ctx_new = nullptr;
            c.error = "the system's libcrypto has no ChaCha20-Poly1305 (EVP_chacha20_poly1305)";
        }
    });
    return c;
}

constexpr size_t kNonceOffset = 4, kNonceBytes = 12;   // the header's kind, sender, step

// EVP takes int lengths: a payload over INT_MAX goes in pieces (frames stop at 64 MiB; this is for safety).
bool add_aad(const Crypto &c, void *ctx, const uint8_t *data, size_t size) {
    while (size > 0) {
        const int piece = (int)std::min<size_t>(size, INT_MAX);
        int out = 0;
        if (c.update(ctx, nullptr, &out, data, piece) != 1) return false;
        data += piece;
        size -= (size_t)piece;
    }
    return true;
}

}  // namespace

bool crypto_available(std::string *why) {
    const Crypto &c = crypto();
    if (c.ctx_new == nullptr && why != nullptr) *why = c.error;
    return c.ctx_new != nullptr;
}

FrameTag &FrameTag::operator=(FrameTag &&other) noexcept {
    if (this != &other) {
        if (ctx_ != nullptr) crypto().ctx_free(ctx_);
        ctx_ = other.ctx_;
        other.ctx_ = nullptr;
    }
    return *this;
}

FrameTag::~FrameTag() {
    if (ctx_ != nullptr) crypto().ctx_free(ctx_);
}

bool FrameTag::set_key(const uint8_t key[32]) {
    const Crypto &c = crypto();
    if (c.ctx_new == nullptr) return false;
    if (ctx_ == nullptr) ctx_ = c.ctx_new();
    return ctx_ != nullptr && c.init(ctx_, c.chacha20_poly1305(), nullptr, key, nullptr) == 1;
}

bool FrameTag::tag(const uint8_t *header, size_t header_size, const void *payload, size_t payload_size,
                   uint8_t out[16]) const {
    const Crypto &c = crypto();
    if (ctx_ == nullptr || header_size < kNonceOffset + kNonceBytes) return false;
    int size = 0;
    unsigned char none[16];
    return c.init(ctx_, nullptr, nullptr, nullptr, header + kNonceOffset) == 1 &&   // the key stays; a new nonce
           add_aad(c, ctx_, header, header_size) &&
           add_aad(c, ctx_, static_cast<const uint8_t *>(payload), payload_size) &&
           c.final(ctx_, none, &size) == 1 && c.ctrl(ctx_, kCtrlAeadGetTag, 16, out) == 1;
}

}  // namespace stackd::tp
