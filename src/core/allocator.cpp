#include "starling/core/allocator.hpp"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace starling {

void tune_allocator() {
#if defined(__GLIBC__)
  mallopt(M_MXFAST, 0);
#endif
}

}  // namespace starling
