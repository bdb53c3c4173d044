// Process-wide allocator settings for a Starling process (the CLI calls this first thing).
//
// glibc's malloc keeps small freed chunks in "fastbins" and walks (consolidates) every one of
// them before any allocation of 1 KiB or more in the same arena. A node allocates both kinds
// all the time (routing-table copies, frames, protobuf strings), from several threads, so
// that walk showed up as ~4% of all CPU in the DHT benchmark (malloc_consolidate). Without
// fastbins small chunks still come from glibc's per-thread cache first; nothing else changes.
#pragma once

namespace starling {

// Turns off glibc's fastbins (mallopt M_MXFAST = 0). A no-op on other C libraries.
// Idempotent; safe to call before or after threads start.
void tune_allocator();

}  // namespace starling
