// bitrefit/durability/filesystem.hpp — the durable commit log and baseline store in directories:
// filesystem_commit_log.hpp (lock, temp, fsync, rename; a fenced epoch is refused) and
// filesystem_baseline_store.hpp (full images and digest-linked deltas in baseline_format.hpp's format).
#pragma once

#include "bitrefit/durability/filesystem_baseline_store.hpp"
#include "bitrefit/durability/filesystem_commit_log.hpp"
