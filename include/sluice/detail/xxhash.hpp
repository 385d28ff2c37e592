// Internal: xxHash, header-only (XXH_INLINE_ALL), so consumers link nothing for it. Its symbols
// are static and renamed by xxHash itself, so this coexists with a separately linked libxxhash.
#ifndef SLUICE_DETAIL_XXHASH_HPP_
#define SLUICE_DETAIL_XXHASH_HPP_

#ifndef XXH_INLINE_ALL
#define XXH_INLINE_ALL
#endif
#include <xxhash.h>

#endif  // SLUICE_DETAIL_XXHASH_HPP_
