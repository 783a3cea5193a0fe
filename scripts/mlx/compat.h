/* Seedbar's compatibility header for building mlx-c against the prebuilt MLX wheel on
 * x86_64 Linux (force-included with -include by scripts/setup.sh; never edits mlx-c).
 * - mlx-c declares float16_t/bfloat16_t only on aarch64: give them 16-bit storage types so
 *   the f16/bf16 accessors exist (MLX reinterprets the bits, no numeric conversion happens).
 * - mlx-c uses std::format, which libstdc++ 12 lacks: map it to header-only fmt. */
#ifndef SEEDBAR_MLX_COMPAT_H
#define SEEDBAR_MLX_COMPAT_H
#if defined(__x86_64__)
#include <stdint.h>
#define HAS_FLOAT16
#define HAS_BFLOAT16
typedef uint16_t float16_t;
typedef uint16_t bfloat16_t;
#endif
#if defined(__cplusplus) && !__has_include(<format>)
#define FMT_HEADER_ONLY
#include <fmt/format.h>
namespace std {
using fmt::format;
}
#endif
#endif
