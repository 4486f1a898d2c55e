// Every weight type our buffers repack, behind one call each way (layout.h, layout_qk.h): what
// the buffers (backend.cpp) call whatever the type.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ggml.h"

namespace stackd {

size_t repacked_bytes(ggml_type type, int64_t rows, int64_t k);
void repack_weight(ggml_type type, const void *plain, int64_t rows, int64_t k, void *out);
void unpack_weight(ggml_type type, const void *packed, int64_t rows, int64_t k, void *plain);

}  // namespace stackd
