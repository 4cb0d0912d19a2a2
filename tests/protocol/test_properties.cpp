#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>
#include "bitrefit/protocol/sim/cluster.hpp"
