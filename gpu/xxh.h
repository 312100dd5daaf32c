/* gpu/xxh.h — xxHash as this project uses it for large buffers: the
 * library's own run-time dispatch (AVX2 / AVX-512 where the CPU has them;
 * xxh_x86dispatch.h redefines XXH3_64bits and XXH3_64bits_update to their
 * _dispatch forms).  Debian builds libxxhash for baseline x86-64, SSE2,
 * which hashed a 32 MiB part just written at 5.7 GB/s here against
 * 10-12 GB/s dispatched. */
#ifndef DTC_XXH_H
#define DTC_XXH_H

#include <xxhash.h>
#if defined(__x86_64__) && defined(__has_include)
#if __has_include(<xxh_x86dispatch.h>)
#include <xxh_x86dispatch.h>
#endif
#endif

#endif
