// bitrefit/durability/durability.hpp — the durability area in one include.
#pragma once

#include "bitrefit/durability/baseline_format.hpp"
#include "bitrefit/durability/change_set.hpp"
#include "bitrefit/durability/concepts.hpp"
#include "bitrefit/durability/etcd_commit_log.hpp"
#include "bitrefit/durability/filesystem.hpp"
#include "bitrefit/durability/filesystem_baseline_store.hpp"
#include "bitrefit/durability/filesystem_commit_log.hpp"
#include "bitrefit/durability/memory.hpp"
#include "bitrefit/durability/s3_baseline_store.hpp"
