# starling_defs: the definitions Starling's public headers need (asio standalone, fmt for
# spdlog); exported, so find_package(Starling) users get them.
add_library(starling_defs INTERFACE)
# ASIO_HAS_STD_ALIGNED_ALLOC: asio detects aligned_alloc from a libstdc++ macro that exists only
# if a standard header came before asio's, so translation units that include asio first chose
# operator new/delete and the others aligned_alloc/free for the same recycled coroutine frames
# (ASan: alloc-dealloc-mismatch across TUs). Fixed here for every TU, ours and users'.
target_compile_definitions(starling_defs INTERFACE ASIO_NO_DEPRECATED ASIO_STANDALONE
  ASIO_HAS_STD_ALIGNED_ALLOC=1 SPDLOG_FMT_EXTERNAL)
if(CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
  # asio only detects coroutine support for GCC; clang 16 + libstdc++ 12 needs these.
  target_compile_definitions(starling_defs INTERFACE ASIO_HAS_CO_AWAIT ASIO_HAS_STD_COROUTINE)
endif()

# starling_options: Starling's own warnings, -Werror and sanitizers. Linked PRIVATE by every
# target of this tree (never exported: a user's build keeps its own flags).
add_library(starling_options INTERFACE)
target_link_libraries(starling_options INTERFACE starling_defs)
target_compile_options(starling_options INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wno-unused-parameter -Wno-missing-field-initializers>)
if(CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
  target_compile_options(starling_options INTERFACE -Wno-gnu-zero-variadic-macro-arguments)
endif()
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
  # GCC 12 at -O2 reports false positives in libstdc++ algorithms (memcmp bounds in
  # vector<uint8_t>::operator<=>) and in asio's coroutine frame allocator (mismatched
  # new/delete); these flow-analysis warnings are off for GCC (clang builds still check).
  target_compile_options(starling_options INTERFACE -Wno-stringop-overread
    -Wno-stringop-overflow -Wno-array-bounds -Wno-restrict -Wno-mismatched-new-delete
    -Wno-maybe-uninitialized)
endif()
if(STARLING_WERROR)
  target_compile_options(starling_options INTERFACE -Werror)
endif()
if(STARLING_SANITIZE)
  target_compile_options(starling_options INTERFACE -fsanitize=address,undefined -fno-omit-frame-pointer
    -fno-sanitize-recover=undefined)
  target_link_options(starling_options INTERFACE -fsanitize=address,undefined)
endif()
if(STARLING_TSAN)
  if(STARLING_SANITIZE)
    message(FATAL_ERROR "STARLING_TSAN and STARLING_SANITIZE cannot be combined")
  endif()
  # -Wno-tsan: GCC warns (an error under -Werror) that TSan does not model
  # std::atomic_thread_fence, which asio's headers use (fenced_block, ref_count_down). The
  # ordering asio relies on across threads comes from its scheduler's mutex; a report that
  # only a fence would explain must name asio frames and is suppressed there, with a reason.
  target_compile_options(starling_options INTERFACE -fsanitize=thread -fno-omit-frame-pointer
    -Wno-tsan)
  target_link_options(starling_options INTERFACE -fsanitize=thread)
endif()
if(STARLING_FUZZ)
  # Coverage instrumentation for the library; the fuzz targets add -fsanitize=fuzzer themselves.
  target_compile_options(starling_options INTERFACE -fsanitize=fuzzer-no-link,address,undefined
    -fno-omit-frame-pointer)
  target_link_options(starling_options INTERFACE -fsanitize=address,undefined)
endif()
